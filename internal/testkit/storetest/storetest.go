// Package storetest is txlimit's conformance suite: the contract of a
// store. Every store's own tests run it through one call,
//
//	storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[pgx.Tx] { … })
//
// and a store is done when it passes. The suite drives the store through
// the public Limiter only, on a real database, in topics that run one after
// another: prune, limits (and their concurrency), limit_all, remaining,
// reservations, edges, windows (sliding and calendar windows, UpTo, and the
// calls that must write nothing), commit (CommitTx and Commit).
//
// The suite imports no database driver: a Harness gives it the store and
// the few things it cannot do through a Limiter (open and end a
// transaction, read the stored rows).
package storetest

import (
	"testing"

	"github.com/txlimit/txlimit/internal/driver"
)

// Harness adapts one store to the suite.
type Harness[TTx any] struct {
	Store driver.Store[TTx]
	// Begin opens a transaction on its own connection.
	Begin    func(t *testing.T) TTx
	Commit   func(tx TTx) error
	Rollback func(tx TTx)
	// Rows returns the stored rows of (name, key) as text, in shard order,
	// exactly enough to tell whether anything was written.
	Rows func(t *testing.T, name, key string) []string
	// Conns is how many transactions may be open at once.
	Conns int
	// SkipsLocked is set for a store that serves a sharded limit from one
	// shard no other transaction holds (PostgreSQL's SKIP LOCKED).
	SkipsLocked bool
}

// Run is the contract of a store: every topic, one after another, each a
// subtest of t named after it. newHarness gives a fresh harness whose
// store may keep conns connections open at once; its resources are
// released by t's cleanups.
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
func Run[TTx any](t *testing.T, newHarness func(t *testing.T, conns int32) Harness[TTx]) {
	t.Run("prune", func(t *testing.T) { runPrune(t, newHarness(t, 3)) })
	// The concurrency tests keep conns-1 = 8 transactions open at once:
	// enough to make callers queue on a row and on every shard.
	shared := newHarness(t, 9)
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
		{"commit", runCommit[TTx]},
	} {
		t.Run(topic.name, func(t *testing.T) { topic.run(t, shared) })
	}
}
