// Package sqldrivers tests txlimit with database/sql drivers that the
// library's module must not require (even a test-only requirement there
// would be in every user's module graph): lib/pq, with which TestLibPQ runs
// the root's conformance suite for pgsqlstore (and TestLibPQRoundTrips counts
// its round trips on the wire), and go-sql-driver/mysql, with
// which TestPgsqlstoreOnMariaDB checks that pgsqlstore names a MySQL or
// MariaDB database as the wrong one.
//
// The suite lives in the root package's tests, which no other module can
// import, so TestLibPQ runs them where they are: `go test` in the root
// directory with an overlay that adds one file importing lib/pq (which
// registers the "postgres" driver the suite then also runs with) and a
// -modfile that is the root's go.mod plus lib/pq at the version this
// module's go.mod requires.
package sqldrivers

import _ "github.com/lib/pq" // the version this module pins is the one the root's tests get
