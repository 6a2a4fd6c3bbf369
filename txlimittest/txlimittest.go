// Package txlimittest helps an application test its code that uses txlimit,
// as River's rivertest does for River users. Import it from _test.go files
// only.
//
// It gives a test four things:
//
//   - A Clock that stands still until the test moves it. Passed as
//     txlimit.Options{Clock: clock.Now}, it replaces the database's clock
//     in every store, in the SQL too, so refills, window boundaries and
//     RetryAfter follow it exactly.
//   - A migrated database for the limiter: SQLite in a temporary file,
//     needing no server; or a fresh PostgreSQL schema per test on the
//     application's own test server (PostgresSchema, Postgres).
//   - Assertions that name the limit, the key, what was expected and what
//     happened: RequireAdmitted, RequireDenied (with its RetryAfter),
//     RequireRemaining, each in a pool form and a Tx form, and
//     RequireRollbackRestores for the promise that a rolled-back
//     transaction spends nothing. Each returns what it read for further
//     checks.
//   - Prune runs to completion, failing the test on an error, so that a
//     test of pruning is deterministic.
//
// A test of a send that a limit guards, on SQLite:
//
//	func TestSendMessageLimit(t *testing.T) {
//		clock := txlimittest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
//		// app.Limits holds "sendMessage": 3 a minute per user.
//		limiter, db := txlimittest.SQLite(t, app.Limits, &txlimit.Options{Clock: clock.Now})
//		srv := app.NewServer(db, limiter) // the code under test
//
//		for range 3 {
//			if err := srv.SendMessage(t.Context(), "alice", "hi"); err != nil {
//				t.Fatal(err)
//			}
//		}
//		txlimittest.RequireDenied(t, limiter, "sendMessage", "alice", 20*time.Second)
//		clock.Advance(20 * time.Second)
//		txlimittest.RequireRemaining(t, limiter, "sendMessage", "alice", 1)
//	}
//
// # Failing
//
// The assertions, like testify's require, end the test with t.Fatalf at the
// first thing that does not hold, so they must be called from the test's
// own goroutine, as t.FailNow must. They take testing.TB, not testify, so
// an application needs no assertion library to use them. Each database call
// they make has a deadline of one minute: a call that waits for a row lock
// held by the test's own open transaction (a form without Tx for a key that
// transaction took) fails the test then, instead of hanging until go test's
// timeout; inside a transaction, use the Tx forms.
//
// # The SQLite driver
//
// Importing txlimittest links modernc.org/sqlite, a pure-Go SQLite, into the
// test binary, and its init registers the database/sql driver name "sqlite",
// as any import of it does. txlimittest opens its databases with
// sqlite.NewConnector and never by that name. A test binary that links
// another driver registering "sqlite" as well (github.com/glebarez/go-sqlite)
// panics at init; github.com/mattn/go-sqlite3, which registers "sqlite3",
// can be linked beside it.
package txlimittest

import (
	"sync"
	"time"
)

// Clock is a clock for txlimit.Options.Clock that stands still until Set or
// Advance moves it:
//
//	clock := txlimittest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
//	limiter, err := txlimit.New(store, limits, &txlimit.Options{Clock: clock.Now})
//
// The limiter reads Options.Clock once per call, in place of the database
// server's clock (clock_timestamp() on PostgreSQL; the process's clock on
// SQLite, which has no server), and hands that reading to the store, whose
// SQL computes with it: so a Clock drives the database side's "now" as well,
// and every refill, window boundary, RetryAfter, Result.At, Remaining and Prune
// follows it. State is kept at microsecond precision, so a limiter uses
// only the whole microseconds of the reading.
//
// A Clock may step backwards (Set to an earlier time, Advance by a negative
// duration), to test what txlimit does then: a limiter adds no tokens for
// it. A Clock is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that stands at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the time the clock stands at. Pass it, the method value
// clock.Now, as txlimit.Options.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d (backwards when d is negative) and
// returns the time it then stands at.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
