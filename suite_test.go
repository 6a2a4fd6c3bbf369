package txlimit_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// runSuite is the contract of a store: every topic, each on a fresh
// harness (its own schema or database file), in parallel. A store is done
// when it passes.
func runSuite[TTx any](t *testing.T, newHarness func(t *testing.T, conns int32) harness[TTx]) {
	// conns is the size of a topic's pool: its concurrency tests keep
	// conns-1 transactions open at once. The limits topic's 8 are enough
	// to make callers queue on a row and on every shard; each more costs
	// a server process per exec mode (about 40 ms of the server's CPU on a
	// small VM).
	topics := []struct {
		name  string
		conns int32
		run   func(t *testing.T, h harness[TTx])
	}{
		{"limits", 9, runConformance[TTx]},
		{"limit_all", 8, runMulti[TTx]},
		{"remaining", 3, runRemaining[TTx]},
		{"reservations", 6, runReservations[TTx]},
		{"prune", 3, runPruneBasics[TTx]},
		{"edges", 4, runEdges[TTx]},
	}
	for _, topic := range topics {
		t.Run(topic.name, func(t *testing.T) {
			t.Parallel()
			topic.run(t, newHarness(t, topic.conns))
		})
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
