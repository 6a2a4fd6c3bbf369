package txlimit_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// runSuite is the contract of a store: every topic, one after another. A
// store is done when it passes.
//
// Prune goes through the whole table, so its topic has a harness of its
// own, closed as the topic ends. The other topics touch only limits of
// their own (unique names) and share one harness: one schema or database
// file and one pool. A pool of their own per topic cost 14 more server
// processes per store and exec mode, about 40 ms of the server's CPU each
// on a small VM, and a fifth of the suite's CPU. The topics do not run in
// parallel with each other: a parallel subtest would leave its parent's
// pool open, and its parallel slot free for another store's, while it
// waits (53300, too many clients, seen at max_connections 100).
func runSuite[TTx any](t *testing.T, newHarness func(t *testing.T, conns int32) harness[TTx]) {
	t.Run("prune", func(t *testing.T) { runPruneBasics(t, newHarness(t, 3)) })
	// The concurrency tests keep conns-1 = 8 transactions open at once:
	// enough to make callers queue on a row and on every shard.
	shared := newHarness(t, 9)
	for _, topic := range []struct {
		name string
		run  func(t *testing.T, h harness[TTx])
	}{
		{"limits", runConformance[TTx]},
		{"limit_all", runMulti[TTx]},
		{"remaining", runRemaining[TTx]},
		{"reservations", runReservations[TTx]},
		{"edges", runEdges[TTx]},
	} {
		t.Run(topic.name, func(t *testing.T) { topic.run(t, shared) })
	}
}

// TestPostgres runs the suite on PostgreSQL in every pgx exec mode (the
// simple protocol and exec modes are what PgBouncer in transaction mode
// needs), then with pgstore.SingleKeyStatements (Citus distributed by key)
// in the default mode and in the simple protocol. The modes' topics are
// parallel tests like any other: -parallel (see TestMain) bounds how many
// run at once, and with it the connections.
func TestPostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range testdb.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			runSuite(t, func(t *testing.T, conns int32) harness[pgx.Tx] {
				return pgHarness(t, testdb.Pool(t, testdb.Schema(t), mode, conns))
			})
		})
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run("single_key_statements/"+mode.String(), func(t *testing.T) {
			t.Parallel()
			runSuite(t, func(t *testing.T, conns int32) harness[pgx.Tx] {
				return pgHarness(t, testdb.Pool(t, testdb.Schema(t), mode, conns), pgstore.SingleKeyStatements())
			})
		})
	}
}

// TestSQLite runs the suite on SQLite.
func TestSQLite(t *testing.T) {
	t.Parallel()
	runSuite(t, func(t *testing.T, _ int32) harness[*sql.Tx] { return sqliteHarness(t, openSQLite(t)) })
}
