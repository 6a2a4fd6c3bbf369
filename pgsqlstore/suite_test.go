package pgsqlstore_test

import (
	"testing"

	"github.com/txlimit/txlimit/internal/testkit/pgsqltest"
)

// TestPostgresDatabaseSQL runs the conformance suite on pgsqlstore with
// pgx's database/sql driver in three exec modes, then with
// pgsqlstore.SingleKeyStatements (Citus distributed by key), in parallel
// like pgstore's TestPostgres. internal/testkit/sqldrivers runs it with lib/pq.
func TestPostgresDatabaseSQL(t *testing.T) {
	t.Parallel()
	pgsqltest.Suite(t, pgsqltest.Pgx)
}

// TestDatabaseSQLThroughPgBouncer is pgstore's TestLimitThroughPgBouncer
// for pgsqlstore, with pgx's driver in the exec modes that work there
// (pgsqltest.ThroughPgBouncer); internal/testkit/sqldrivers runs it with lib/pq.
func TestDatabaseSQLThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pgsqltest.ThroughPgBouncer(t, pgsqltest.Pgx)
}

// TestDatabaseSQLRetryableConnectErrors checks which failures to connect
// through pgx's database/sql driver pgsqlstore.Retryable calls transient
// (pgsqltest.RetryableConnectErrors); internal/testkit/sqldrivers runs it with
// lib/pq.
func TestDatabaseSQLRetryableConnectErrors(t *testing.T) {
	t.Parallel()
	pgsqltest.RetryableConnectErrors(t, pgsqltest.Pgx)
}
