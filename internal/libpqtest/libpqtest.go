// Package libpqtest runs txlimit's conformance suite for pgsqlstore with
// lib/pq, a module of its own so that lib/pq stays out of the library's
// go.mod (a test-only requirement there would still be in every user's
// module graph).
//
// The suite lives in the root package's tests, which no other module can
// import, so TestLibPQ runs them where they are: `go test` in the root
// directory with an overlay that adds one file importing lib/pq (which
// registers the "postgres" driver the suite then also runs with) and a
// -modfile that is the root's go.mod plus lib/pq at the version this
// module's go.mod requires.
package libpqtest

import _ "github.com/lib/pq" // the version this module pins is the one the root's tests get
