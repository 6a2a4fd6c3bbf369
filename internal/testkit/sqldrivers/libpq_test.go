package sqldrivers

import (
	"testing"

	"github.com/txlimit/txlimit/internal/testkit/pgsqltest"
)

// The tests pgsqlstore runs with pgx's database/sql driver, here with
// lib/pq (registered by this package's import of it), as it is and with
// binary_parameters=yes: the conformance suite (subtests
// TestPostgresDatabaseSQL/libpq/<topic>, …/libpq_binary_parameters/<topic>
// and …/single_key_statements/libpq/<topic>), the PgBouncer
// transaction-mode case (which skips without pgbouncer, except under
// CI=true), and pgsqlstore.Retryable on lib/pq's failures to connect.

func TestPostgresDatabaseSQL(t *testing.T) {
	t.Parallel()
	pgsqltest.Suite(t, pgsqltest.LibPQ)
}

func TestDatabaseSQLThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pgsqltest.ThroughPgBouncer(t, pgsqltest.LibPQ)
}

func TestDatabaseSQLRetryableConnectErrors(t *testing.T) {
	t.Parallel()
	pgsqltest.RetryableConnectErrors(t, pgsqltest.LibPQ)
}
