// Package sqldrivers tests txlimit with a database/sql driver that the
// library's module must not require (even a test-only requirement there
// would be in every user's module graph): lib/pq, with which pgsqlstore's
// database/sql tests run here (the conformance suite, the PgBouncer case,
// Retryable on failures to connect: internal/testkit/pgsqltest, which pgsqlstore's
// own tests run with pgx's driver) and TestLibPQRoundTrips counts its round
// trips on the wire.
//
// This module's path is under the library's, so it may import the
// library's internal packages (internal/testkit/pgsqltest, internal/testkit/storetest,
// internal/testkit/testdb); its go.mod replaces the library with this checkout.
package sqldrivers

import _ "github.com/lib/pq" // registers "postgres", the driver name internal/testkit/pgsqltest's LibPQ opens
