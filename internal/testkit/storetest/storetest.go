// Package storetest is txlimit's conformance suite: the contract of a
// store. Every store's own tests run it through one call,
//
//	storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[pgx.Tx] { … })
//
// and a store is done when it passes. The suite drives the store through
// the public Limiter only, on a real database, in topics that run one after
// another: prune (and prune/equivalence: Prune changes no decision), limits (and
// their concurrency), limit_all, remaining, reservations, edges, windows
// (sliding and calendar windows, UpTo, and the calls that must write
// nothing), config-change (each row of docs/config-changes.md: what a key
// holds when its limit's config changes), commit (CommitTx and Commit), wait (Limiter.Wait), concurrency
// nothing), commit (CommitTx and Commit), wait (Limiter.Wait), pause
// (Limiter.Pause: denials until the instant, across Limiters, in LimitAll,
// reservations, Prune, lifting, rollback), concurrency
// (Concurrency limits: exactly Capacity of 64 concurrent acquirers at every
// isolation level, release, extend, reclaim, and a holder whose process is
// killed), idempotent (idempotent takes: a repeat returns the first
// call's result and takes nothing, exactly one take of 32 concurrent
// repeats at every isolation level, a repeat of another request refused,
// rollbacks, denials, the window and Prune) and soak
// (mixed limits under load, with rollbacks and killed connections: the
// committed business rows are exactly what the limits allow).
//
// The suite imports no database driver: a Harness gives it the store and
// the few things it cannot do through a Limiter (open and end a
// transaction, read the stored rows).
package storetest

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/txlimit/txlimit/internal/driver"
)

// Harness adapts one store to the suite.
type Harness[TTx any] struct {
	Store driver.Store[TTx]
	// Begin opens a transaction on its own connection.
	Begin func(t *testing.T) TTx
	// TryBegin is Begin returning its error instead of failing t: the
	// soak's workers call it on goroutines of their own, on connections
	// Kill may have ended.
	TryBegin func(ctx context.Context) (TTx, error)
	Commit   func(tx TTx) error
	Rollback func(tx TTx)
	// Rows returns the stored rows of (name, key) as text, in shard order,
	// exactly enough to tell whether anything was written.
	Rows func(t *testing.T, name, key string) []string
	// Exec runs a statement of the test's own in tx, and QueryInt a query
	// of one integer: the soak's business table, in SQL that every store's
	// dialect reads alike (no parameters: their placeholders differ).
	Exec     func(ctx context.Context, tx TTx, query string) error
	QueryInt func(ctx context.Context, tx TTx, query string) (int64, error)
	// Retryable reports whether err, met by a transaction under load, is
	// one an application retries: the store's Retryable (a deadlock, a lost
	// connection), a busy SQLite database, a transaction whose connection
	// Kill ended. The soak counts those and fails on any other.
	Retryable func(err error) bool
	// Kill, when set, ends one connection of the store's pool at random,
	// in a transaction or idle, never the one it runs on itself.
	Kill func(ctx context.Context) error
	// Conns is how many transactions may be open at once.
	Conns int
	// SkipsLocked is set for a store that serves a sharded limit from one
	// shard no other transaction holds (PostgreSQL's SKIP LOCKED).
	SkipsLocked bool
	// BeginLevel begins a transaction at an isolation level on a
	// connection of its own, and Levels are the levels the store supports,
	// at which the concurrency topic's acquirers run.
	BeginLevel func(ctx context.Context, level sql.IsolationLevel) (TTx, error)
	Levels     []sql.IsolationLevel
	// Database names the database the store is on (a PostgreSQL schema, a
	// SQLite file, a MySQL database), for a process of the test binary run
	// again: there ChildDatabase holds it, and the helpers that make a
	// database (testdb.Schema, testdb.OpenSQLite, mysqltest.Database)
	// return that one instead.
	Database func(t *testing.T) string
	// Headroom, when set, returns how many more connections the server
	// takes (max_connections less those open), for the concurrency topic,
	// which opens 65 at once and waits for room for them.
	Headroom func(ctx context.Context) (int64, error)
}

// ChildDatabase is the variable of the environment that tells a test
// binary run again by the concurrency topic (a holder it kills) the
// database to open: Harness.Database's.
const ChildDatabase = "TXLIMIT_STORETEST_DATABASE"

// Run is the contract of a store: every topic, one after another, each a
// subtest of t named after it. newHarness gives a fresh harness whose
// store may keep conns connections open at once; its resources are
// released by t's cleanups.
//
// Prune goes through the whole table, so its topic has a harness of its
// own, closed as the topic ends: first what Prune deletes and keeps (it
// counts every row), then the equivalence test's pruned run (its plain run
// is on the shared harness). The other topics touch only limits of their
// own (unique names) and share one harness: one schema or database file
// and one pool. A pool of their own per topic cost 14 more server
// processes per store and exec mode, about 40 ms of the server's CPU each
// on a small VM, and a fifth of the suite's CPU. The topics do not run in
// parallel with each other: a parallel subtest would leave its parent's
// pool open, and its parallel slot free for another store's, while it
// waits (53300, too many clients, seen at max_connections 100). The
// concurrency topic opens two harnesses of its own: one for Prune (which
// deletes every expired holder) and one of 65 connections for its 64
// acquirers, which run when no other topic of any test binary of the
// machine does, and there is room on the server (gate.go); the idempotent
// topic opens one of 33 for its 32 repeaters, the same way. It also runs the test binary again,
// as a holder it kills: in that process Run does nothing but hold a slot
// (ChildDatabase). The soak comes last: the connections it kills may still
// be in the pool after it.
func Run[TTx any](t *testing.T, newHarness func(t *testing.T, conns int32) Harness[TTx]) {
	if os.Getenv(ChildDatabase) != "" {
		// A holder the concurrency topic runs in a process of its own.
		holderChild(t, newHarness(t, 2))
		return
	}
	// The concurrency tests keep conns-1 = 8 transactions open at once:
	// enough to make callers queue on a row and on every shard.
	shared := newHarness(t, 9)
	t.Run("prune", func(t *testing.T) {
		defer enterShared(t)()
		pruned := newHarness(t, 3)
		runPrune(t, pruned)
		t.Run("equivalence", func(t *testing.T) { runPruneEquivalence(t, shared, pruned) })
	})
	for _, topic := range []struct {
		name string
		run  func(t *testing.T, h Harness[TTx])
	}{
		{"limits", runLimits[TTx]},
		{"limit_all", runLimitAll[TTx]},
		{"remaining", runRemaining[TTx]},
		{"reservations", runReservations[TTx]},
		{"edges", runEdges[TTx]},
		{"windows", runWindows[TTx]},
		{"config-change", runConfigChange[TTx]},
		{"commit", runCommit[TTx]},
		{"wait", runWait[TTx]},
		{"pause", runPause[TTx]},
		{"concurrency", func(t *testing.T, h Harness[TTx]) { runConcurrency(t, h, newHarness) }},
		{"idempotent", func(t *testing.T, h Harness[TTx]) { runIdempotent(t, h, newHarness) }},
		{"soak", runSoak[TTx]},
	} {
		t.Run(topic.name, func(t *testing.T) {
			if topic.name != "concurrency" && topic.name != "idempotent" { // they enter the gate on their own
				defer enterShared(t)()
			}
			topic.run(t, shared)
		})
	}
}
