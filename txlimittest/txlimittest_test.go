package txlimittest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/sqlitestore"
	"github.com/txlimit/txlimit/txlimittest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// perMinute is a token bucket of 3 tokens a minute: with a Clock, a
// denial of one token says RetryAfter 20s.
var perMinute = map[string]txlimit.Config{
	"send": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute},
}

// recorder is a testing.TB that records failures instead of reporting
// them, so that a test can require an assertion to fail. The rest
// (Cleanup, Context, Logf, TempDir) goes to the real test it embeds.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) Fail()                             { r.fail("Fail()") }
func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *recorder) FailNow()                          { r.fail("FailNow()"); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// record runs fn with a recorder on a goroutine of its own, as package
// testing runs a test, so that a Fatalf ends fn alone.
func record(t *testing.T, fn func(t testing.TB)) *recorder {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

// mustFail requires fn to fail, with a message that contains each of wants.
func mustFail(t *testing.T, fn func(t testing.TB), wants ...string) {
	t.Helper()
	r := record(t, fn)
	if !r.Failed() {
		t.Fatalf("the assertion passed; want it to fail with %q", wants)
	}
	out := r.output()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("failure message %q does not contain %q", out, w)
		}
	}
	t.Logf("failed as wanted: %s", out)
}

// mustPass requires fn not to fail.
func mustPass(t *testing.T, fn func(t testing.TB)) {
	t.Helper()
	if r := record(t, fn); r.Failed() {
		t.Fatalf("the assertion failed: %s", r.output())
	}
}

// exampleT stands in for the *testing.T of a test in the examples, which
// have none: it runs the cleanups when the example ends, and a failure
// panics, which fails the example.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (e *exampleT) Helper()                           {}
func (e *exampleT) Context() context.Context          { return context.Background() }
func (e *exampleT) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleT) Error(args ...any)                 { panic(fmt.Sprint(args...)) }
func (e *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (e *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// sqliteLimiter is a limiter of limits on SQLite with a Clock at t0.
func sqliteLimiter(t *testing.T, limits map[string]txlimit.Config) (*txlimit.Limiter[*sql.Tx], *sql.DB, *txlimittest.Clock) {
	t.Helper()
	clock := txlimittest.NewClock(t0)
	l, db := txlimittest.SQLite(t, limits, &txlimit.Options{Clock: clock.Now})
	return l, db, clock
}

func begin(t testing.TB, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// drain takes the 3 tokens of "send" for key.
func drain(t *testing.T, l *txlimit.Limiter[*sql.Tx], key string) {
	t.Helper()
	for range 3 {
		res, err := l.Limit(context.Background(), "send", key)
		if err != nil || !res.OK {
			t.Fatalf("Limit: %+v, %v", res, err)
		}
	}
}

func TestClock(t *testing.T) {
	c := txlimittest.NewClock(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now = %v, want %v", got, t0)
	}
	if got := c.Advance(90 * time.Second); !got.Equal(t0.Add(90*time.Second)) || !c.Now().Equal(got) {
		t.Fatalf("Advance returned %v, Now %v; want both %v", got, c.Now(), t0.Add(90*time.Second))
	}
	if got := c.Advance(-30 * time.Second); !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Advance(-30s) = %v, want %v", got, t0.Add(time.Minute))
	}
	c.Set(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("after Set, Now = %v, want %v", got, t0)
	}

	// Safe for concurrent use: -race checks it; the sum checks that no
	// Advance was lost.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), t0.Add(800*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after 800 concurrent Advance(1ms), Now = %v, want %v", got, want)
	}
}

// The Clock drives the limiter: its readings are the Results' At, and a
// refill follows Advance exactly.
func TestClockDrivesTheLimiter(t *testing.T) {
	l, _, clock := sqliteLimiter(t, perMinute)
	drain(t, l, "alice")
	res := txlimittest.RequireDenied(t, l, "send", "alice", 20*time.Second)
	if !res.At.Equal(t0) {
		t.Errorf("At = %v, want the clock's %v", res.At, t0)
	}
	clock.Advance(10 * time.Second)
	txlimittest.RequireDenied(t, l, "send", "alice", 10*time.Second)
	txlimittest.RequireRemaining(t, l, "send", "alice", 0.5)
	clock.Advance(10 * time.Second)
	res = txlimittest.RequireAdmitted(t, l, "send", "alice")
	if !res.At.Equal(t0.Add(20 * time.Second)) {
		t.Errorf("At = %v, want %v", res.At, t0.Add(20*time.Second))
	}
	// Stepping back adds nothing and takes nothing: the limit is decided
	// as at its last update, 20s later, and the wait counts from now.
	clock.Set(t0)
	txlimittest.RequireDenied(t, l, "send", "alice", 40*time.Second)
}

func TestSQLite(t *testing.T) {
	var dir string
	t.Run("use", func(t *testing.T) {
		l, db, _ := sqliteLimiter(t, perMinute)
		var file string
		if err := db.QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
			t.Fatal(err)
		}
		dir = filepath.Dir(file)
		if _, err := os.Stat(file); err != nil {
			t.Fatalf("the database is not a file: %v", err)
		}
		var mode string
		if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("journal_mode = %q, %v; want wal", mode, err)
		}
		// The application's own tables go beside txlimit's, and its
		// transactions are the limiter's.
		if _, err := db.Exec("CREATE TABLE messages (body TEXT)"); err != nil {
			t.Fatal(err)
		}
		tx := begin(t, db)
		txlimittest.RequireAdmittedTx(t, l, tx, "send", "alice")
		if _, err := tx.Exec("INSERT INTO messages VALUES ('hi')"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		txlimittest.RequireRemaining(t, l, "send", "alice", 2)
		if err := l.Ping(context.Background()); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	})
	if dir == "" {
		t.Fatal("no database directory")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the database's directory %s is still there after the test: %v", dir, err)
	}
}

func TestSQLiteBadConfig(t *testing.T) {
	mustFail(t, func(tb testing.TB) {
		txlimittest.SQLite(tb, map[string]txlimit.Config{"send": {Kind: txlimit.TokenBucket, Rate: -1, Period: time.Minute}}, nil)
	}, "txlimittest.SQLite", "txlimit.New", "Rate")
}

func TestRequireAdmitted(t *testing.T) {
	l, db, _ := sqliteLimiter(t, perMinute)
	ctx := context.Background()

	mustPass(t, func(tb testing.TB) {
		res := txlimittest.RequireAdmitted(tb, l, "send", "alice")
		if !res.OK || res.Remaining != 2 || !res.At.Equal(t0) {
			t.Errorf("returned %+v, want the admitted Result with Remaining 2 at t0", res)
		}
		tx := begin(tb, db)
		defer tx.Rollback()
		res = txlimittest.RequireAdmittedTx(tb, l, tx, "send", "bob", txlimit.Count(2))
		if res.Count != 2 || res.Remaining != 1 {
			t.Errorf("returned %+v, want Count 2, Remaining 1", res)
		}
	})
	txlimittest.RequireRemaining(t, l, "send", "bob", 3) // that transaction rolled back

	drain(t, l, "carol")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireAdmitted(tb, l, "send", "carol") },
		`txlimittest: Limit("send", "carol")`, "want admitted", "got denied with RetryAfter 20s", "Remaining 0", "2026-03-01T12:00:00Z")
	mustFail(t, func(tb testing.TB) {
		tx := begin(tb, db)
		defer tx.Rollback()
		txlimittest.RequireAdmittedTx(tb, l, tx, "send", "carol", txlimit.Count(2))
	}, `txlimittest: LimitTx("send", "carol")`, "want admitted", "got denied with RetryAfter 40s for Count 2")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireAdmitted(tb, l, "nope", "carol") },
		`Limit("nope", "carol")`, "want admitted, got error", "Inline")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireAdmitted(tb, l, "send", "dave", txlimit.Count(4)) },
		"want admitted, got error", "exceeds Capacity")

	// A reservation is admitted.
	mustPass(t, func(tb testing.TB) {
		res := txlimittest.RequireAdmitted(tb, l, "send", "carol", txlimit.Reserve())
		if !res.OK || res.RetryAfter != 20*time.Second {
			t.Errorf("returned %+v, want a reservation with RetryAfter 20s", res)
		}
	})

	// A grant by FailOpen is not an admission: the store failed.
	openDB := failingDB(t)
	open, err := txlimit.New(sqlitestore.New(openDB), perMinute, &txlimit.Options{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := open.Limit(ctx, "send", "alice"); err != nil || !res.FailedOpen {
		t.Fatalf("the failing store did not fail open: %+v, %v", res, err)
	}
	mustFail(t, func(tb testing.TB) { txlimittest.RequireAdmitted(tb, open, "send", "alice") },
		`Limit("send", "alice")`, "want admitted", "Options.FailOpen", "the store failed")
}

func TestRequireDenied(t *testing.T) {
	l, db, _ := sqliteLimiter(t, perMinute)
	drain(t, l, "alice")

	mustPass(t, func(tb testing.TB) {
		res := txlimittest.RequireDenied(tb, l, "send", "alice", 20*time.Second)
		if res.OK || res.RetryAfter != 20*time.Second || res.Name != "send" || res.Key != "alice" {
			t.Errorf("returned %+v, want the denial", res)
		}
		txlimittest.RequireDenied(tb, l, "send", "alice", txlimittest.AnyRetryAfter, txlimit.Count(2))
		tx := begin(tb, db)
		defer tx.Rollback()
		res = txlimittest.RequireDeniedTx(tb, l, tx, "send", "alice", 40*time.Second, txlimit.Count(2))
		if res.Count != 2 {
			t.Errorf("returned %+v, want Count 2", res)
		}
		txlimittest.RequireDeniedTx(tb, l, tx, "send", "alice", txlimittest.AnyRetryAfter)
	})

	mustFail(t, func(tb testing.TB) { txlimittest.RequireDenied(tb, l, "send", "alice", 19*time.Second) },
		`txlimittest: Limit("send", "alice")`, "want denied with RetryAfter 19s", "got denied with RetryAfter 20s")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireDenied(tb, l, "send", "bob", 20*time.Second) },
		`Limit("send", "bob")`, "want denied with RetryAfter 20s", "got admitted (Remaining 2)")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireDenied(tb, l, "send", "carol", txlimittest.AnyRetryAfter) },
		`Limit("send", "carol")`, "want denied, got admitted")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireDenied(tb, l, "send", "alice", txlimittest.AnyRetryAfter, txlimit.Reserve())
	}, "want denied, got a reservation with RetryAfter 20s")
	mustFail(t, func(tb testing.TB) {
		tx := begin(tb, db)
		defer tx.Rollback()
		txlimittest.RequireDeniedTx(tb, l, tx, "send", "dave", time.Second)
	}, `txlimittest: LimitTx("send", "dave")`, "want denied with RetryAfter 1s", "got admitted")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireDenied(tb, l, "nope", "alice", time.Second) },
		`Limit("nope", "alice")`, "got error")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireDenied(tb, l, "send", "alice", -time.Second) },
		"RetryAfter -1s", "AnyRetryAfter")
}

func TestRequireRemaining(t *testing.T) {
	l, db, clock := sqliteLimiter(t, perMinute)
	drain(t, l, "alice")
	clock.Advance(10 * time.Second)

	mustPass(t, func(tb testing.TB) {
		s := txlimittest.RequireRemaining(tb, l, "send", "alice", 0.5)
		if s.Remaining != 0.5 || !s.At.Equal(t0.Add(10*time.Second)) || s.Name != "send" || s.Key != "alice" || s.Leased != 0 {
			t.Errorf("returned %+v, want the Result", s)
		}
		txlimittest.RequireRemaining(tb, l, "send", "bob", 3)
		// Within the documented tolerance.
		txlimittest.RequireRemaining(tb, l, "send", "alice", 0.5+1e-10)
		txlimittest.RequireRemaining(tb, l, "send", "bob", 3*(1-1e-10))
		// Inline, for a limit New was not given.
		txlimittest.RequireRemaining(tb, l, "other", "bob", 7, txlimit.Inline(txlimit.Config{Kind: txlimit.FixedWindow, Rate: 7, Period: time.Hour}))
		// Only Inline is used among opts: a Count above Capacity reads the
		// limit all the same, and so does a Capacity below one token.
		txlimittest.RequireRemaining(tb, l, "send", "bob", 3, txlimit.Count(5))
		txlimittest.RequireRemaining(tb, l, "tiny", "bob", 0.5, txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 0.5, Period: time.Hour}))

		tx := begin(tb, db)
		defer tx.Rollback()
		txlimittest.RequireAdmittedTx(tb, l, tx, "send", "bob")
		txlimittest.RequireRemainingTx(tb, l, tx, "send", "bob", 2)
		txlimittest.RequireRemaining(tb, l, "send", "bob", 3) // not committed
	})

	mustFail(t, func(tb testing.TB) { txlimittest.RequireRemaining(tb, l, "send", "alice", 1) },
		`txlimittest: Check("send", "alice")`, "want 1 tokens, got 0.5 at 2026-03-01T12:00:10Z")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireRemaining(tb, l, "send", "alice", 0.5+1e-8) },
		"got 0.5")
	mustFail(t, func(tb testing.TB) {
		tx := begin(tb, db)
		defer tx.Rollback()
		txlimittest.RequireRemainingTx(tb, l, tx, "send", "alice", 0)
	}, `txlimittest: CheckTx("send", "alice")`, "want 0 tokens, got 0.5")
	mustFail(t, func(tb testing.TB) { txlimittest.RequireRemaining(tb, l, "nope", "alice", 0) },
		`Check("nope", "alice")`, "got error")
}

func TestRequireRollbackRestores(t *testing.T) {
	l, db, clock := sqliteLimiter(t, perMinute)
	ctx := context.Background()

	// What fn takes in the transaction comes back at the rollback: LimitTx,
	// a reservation, a ResetTx of a drained key, a CreditTx.
	mustPass(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "alice", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "alice", txlimit.Count(2))
			txlimittest.RequireRemainingTx(tb, l, tx, "send", "alice", 1)
		})
	})
	txlimittest.RequireRemaining(t, l, "send", "alice", 3)
	drain(t, l, "bob")
	mustPass(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "bob", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "bob", txlimit.Reserve())
		})
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "bob", func(tx *sql.Tx) {
			if err := l.ResetTx(ctx, tx, "send", "bob"); err != nil {
				tb.Fatal(err)
			}
		})
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "bob", func(tx *sql.Tx) {
			if err := l.CreditTx(ctx, tx, "send", "bob", 1); err != nil {
				tb.Fatal(err)
			}
		})
	})
	txlimittest.RequireRemaining(t, l, "send", "bob", 0)

	// fn that takes nothing proves nothing.
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "carol", func(tx *sql.Tx) {})
	}, `txlimittest: RequireRollbackRestores("send", "carol")`, "fn changed nothing in the transaction", "holds 3 tokens")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "carol", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "someone else")
		})
	}, "fn changed nothing")

	// A change committed outside the transaction is not undone by its
	// rollback: here begin spends a token in a transaction of its own
	// before it begins the one it returns.
	spendThenBegin := func() (*sql.Tx, error) {
		if _, err := l.Limit(ctx, "send", "dave"); err != nil {
			return nil, err
		}
		return db.Begin()
	}
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, spendThenBegin, "send", "dave", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "dave")
		})
	}, `RequireRollbackRestores("send", "dave")`, "the rollback did not restore the limit", "holds 2 tokens after the rollback, 3 before the transaction and 1 in it")

	// A clock that moves between the readings makes them incomparable.
	drain(t, l, "erin")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "erin", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "erin", txlimit.Reserve(), txlimit.Count(2))
			clock.Advance(20 * time.Second)
		})
	}, "holds 1 tokens after the rollback and held 0 before the transaction (-1 in it)",
		"the clock moved between the readings, from 2026-03-01T12:00:00Z to 2026-03-01T12:00:20Z", "txlimittest.Clock")

	// When fn ends the test, the transaction is rolled back anyway: the
	// write lock it took is free again, and what it took came back.
	before := txlimittest.RequireRemaining(t, l, "send", "frank", 3)
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "frank", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "frank")
			tb.Fatal("fn gives up")
		})
	}, "fn gives up")
	txlimittest.RequireRemaining(t, l, "send", "frank", before.Remaining)
	txlimittest.RequireAdmitted(t, l, "send", "frank")

	// Errors.
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, func() (*sql.Tx, error) { return nil, errors.New("no connection") }, "send", "gina", func(tx *sql.Tx) {})
	}, `RequireRollbackRestores("send", "gina")`, "begin: no connection")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "nope", "gina", func(tx *sql.Tx) {})
	}, `RequireRollbackRestores("nope", "gina")`, "Check before the transaction")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, db.Begin, "send", "gina", func(tx *sql.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "gina")
			_ = tx.Commit() // the code under test must not end the transaction it is given
		})
	}, "CheckTx in the transaction", "already been committed")
}

func TestPrune(t *testing.T) {
	l, _, clock := sqliteLimiter(t, perMinute)
	for _, key := range []string{"a", "b", "c"} {
		txlimittest.RequireAdmitted(t, l, "send", key)
	}
	drain(t, l, "d")
	mustPass(t, func(tb testing.TB) {
		r := txlimittest.Prune(tb, l, nil)
		if r != (txlimit.PruneResult{Keys: 4, Batches: 2, Complete: true}) { // a batch of keys, one of idempotency keys
			t.Errorf("Prune before any refill = %+v, want 4 keys examined, none deleted", r)
		}
	})
	clock.Advance(20 * time.Second) // a, b and c are full again; d holds 1
	mustPass(t, func(tb testing.TB) {
		// One key a batch, one batch a call: Prune calls until the end.
		r := txlimittest.Prune(tb, l, &txlimit.PruneOptions{BatchSize: 1, MaxBatches: 1})
		if r.Deleted != 3 || r.Keys != 4 || !r.Complete || r.Batches < 4 {
			t.Errorf("Prune = %+v, want 3 rows deleted of 4 keys, in 4 batches or more, Complete", r)
		}
	})
	txlimittest.RequireRemaining(t, l, "send", "a", 3)
	txlimittest.RequireRemaining(t, l, "send", "d", 1)

	mustFail(t, func(tb testing.TB) { txlimittest.Prune(tb, l, &txlimit.PruneOptions{BatchSize: -1}) },
		"txlimittest: Prune", "BatchSize")
}

// failingDB is a SQLite database that is closed: every call on it fails.
func failingDB(t *testing.T) *sql.DB {
	t.Helper()
	_, db := txlimittest.SQLite(t, nil, nil)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return db
}
