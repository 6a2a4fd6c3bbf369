package pgstore_test

import (
	"database/sql"
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
				return atLevels(pgxtest.Harness(pool, pgstore.New(pool)), mode)
			})
		})
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run("single_key_statements/"+mode.String(), func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[pgx.Tx] {
				pool := testdb.Pool(t, testdb.Schema(t), mode, conns)
				return atLevels(pgxtest.Harness(pool, pgstore.New(pool, pgstore.SingleKeyStatements())), mode)
			})
		})
	}
}

// atLevels keeps every isolation level for the concurrency topic's 64
// acquirers in the default exec mode, and READ COMMITTED alone (the level
// at which two acquirers would both count a free slot) in the others: the
// statements and their retries are the same in every mode, which changes
// only how they reach the server, and each level costs 64 server
// connections that the topic opens while no other test runs (gate.go).
func atLevels(h storetest.Harness[pgx.Tx], mode pgx.QueryExecMode) storetest.Harness[pgx.Tx] {
	if mode != pgx.QueryExecModeCacheStatement {
		h.Levels = []sql.IsolationLevel{sql.LevelReadCommitted}
	}
	return h
}
