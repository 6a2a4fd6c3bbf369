package pgstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/testkit/pgxtest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// TestPostgres runs the conformance suite on PostgreSQL in every pgx exec
// mode (the simple protocol and exec modes are what PgBouncer in
// transaction mode needs), then with pgstore.SingleKeyStatements (Citus
// distributed by key) in the default mode and in the simple protocol. The
// modes are parallel tests like any other: -parallel (see TestMain) bounds
// how many run at once, and with it the connections.
func TestPostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range testdb.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[pgx.Tx] {
				pool := testdb.Pool(t, testdb.Schema(t), mode, conns)
				return pgxtest.Harness(pool, pgstore.New(pool))
			})
		})
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run("single_key_statements/"+mode.String(), func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[pgx.Tx] {
				pool := testdb.Pool(t, testdb.Schema(t), mode, conns)
				return pgxtest.Harness(pool, pgstore.New(pool, pgstore.SingleKeyStatements()))
			})
		})
	}
}
