package txlimittest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/txlimit/txlimit"
)

// callTimeout is the deadline of each database call an assertion makes.
const callTimeout = time.Minute

// AnyRetryAfter, passed to RequireDenied as the RetryAfter it wants, accepts
// a denial whatever its RetryAfter.
const AnyRetryAfter time.Duration = -1

// tolerance is how far apart two token counts may be and still be equal:
// refills are computed in float64 from microseconds, so 1 may come out as
// 0.9999999999999999.
const tolerance = 1e-9

// RequireAdmitted calls l.Limit(name, key, opts...), which consumes the
// tokens in a transaction of its own, and ends the test unless the call was
// admitted. A reservation (the Reserve option) is admitted too; check the
// returned Result's RetryAfter for it. A grant by Options.FailOpen is not:
// it means that the store failed.
func RequireAdmitted[TTx any](t testing.TB, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.Limit(ctx, name, key, opts...)
	requireAdmitted(t, call("Limit", name, key), res, err)
	return res
}

// RequireAdmittedTx is RequireAdmitted with l.LimitTx in tx: the tokens are
// spent if and only if tx commits.
func RequireAdmittedTx[TTx any](t testing.TB, l *txlimit.Limiter[TTx], tx TTx, name, key string, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.LimitTx(ctx, tx, name, key, opts...)
	requireAdmitted(t, call("LimitTx", name, key), res, err)
	return res
}

func requireAdmitted(t testing.TB, c string, res txlimit.Result, err error) {
	t.Helper()
	switch {
	case err != nil:
		t.Fatalf("%s: want admitted, got error: %v", c, explain(err))
	case res.FailedOpen:
		t.Fatalf("%s: want admitted, got a grant by Options.FailOpen: the store failed (the error went to Options.Observer)", c)
	case !res.OK:
		t.Fatalf("%s: want admitted, got denied with RetryAfter %v%s at %s", c, res.RetryAfter, counts(res), at(res.At))
	}
}

// RequireDenied calls l.Limit(name, key, opts...) and ends the test unless
// the call was denied with a RetryAfter of exactly retryAfter, or with any
// RetryAfter when retryAfter is AnyRetryAfter. A denial writes nothing, so
// the call changes no state when the assertion holds. A reservation is not a
// denial.
//
// RetryAfter is kept in whole microseconds. With a Clock, a token bucket of
// Rate r per Period p that lacks x tokens says x·p/r: for example 20s for
// one token of a limit of 3 a minute.
func RequireDenied[TTx any](t testing.TB, l *txlimit.Limiter[TTx], name, key string, retryAfter time.Duration, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	checkRetryAfter(t, retryAfter)
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.Limit(ctx, name, key, opts...)
	requireDenied(t, call("Limit", name, key), retryAfter, res, err)
	return res
}

// RequireDeniedTx is RequireDenied with l.LimitTx in tx. A denial writes
// nothing, so tx stays usable.
func RequireDeniedTx[TTx any](t testing.TB, l *txlimit.Limiter[TTx], tx TTx, name, key string, retryAfter time.Duration, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	checkRetryAfter(t, retryAfter)
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.LimitTx(ctx, tx, name, key, opts...)
	requireDenied(t, call("LimitTx", name, key), retryAfter, res, err)
	return res
}

func checkRetryAfter(t testing.TB, retryAfter time.Duration) {
	t.Helper()
	if retryAfter < 0 && retryAfter != AnyRetryAfter {
		t.Fatalf("txlimittest: RequireDenied wants RetryAfter %v, which no denial has (it is never negative); pass txlimittest.AnyRetryAfter to accept any", retryAfter)
	}
}

func requireDenied(t testing.TB, c string, retryAfter time.Duration, res txlimit.Result, err error) {
	t.Helper()
	want := "denied"
	if retryAfter != AnyRetryAfter {
		want = fmt.Sprintf("denied with RetryAfter %v", retryAfter)
	}
	switch {
	case err != nil:
		t.Fatalf("%s: want %s, got error: %v", c, want, explain(err))
	case res.FailedOpen:
		t.Fatalf("%s: want %s, got a grant by Options.FailOpen: the store failed (the error went to Options.Observer)", c, want)
	case res.OK && res.RetryAfter > 0:
		t.Fatalf("%s: want %s, got a reservation with RetryAfter %v%s at %s", c, want, res.RetryAfter, counts(res), at(res.At))
	case res.OK:
		t.Fatalf("%s: want %s, got admitted%s at %s", c, want, counts(res), at(res.At))
	case retryAfter != AnyRetryAfter && res.RetryAfter != retryAfter:
		t.Fatalf("%s: want %s, got denied with RetryAfter %v%s at %s", c, want, res.RetryAfter, counts(res), at(res.At))
	}
}

// RequireRemaining reads l.Check(name, key, opts...) asking for no token
// (Count(0)): Result.Remaining, the tokens the limit holds now, summed over
// its shards, as last committed; and ends the test unless it is want, to
// within a relative 1e-9 (an absolute 1e-9 below one token): refills are
// computed in float64, so a limit that has refilled one token may hold
// 0.9999999999999999. It returns the Result it read (Remaining, Leased,
// At). Only Inline is used among opts. While reservations are outstanding
// the value is negative. A grant by Options.FailOpen reads nothing: it ends
// the test, since it means that the store failed.
func RequireRemaining[TTx any](t testing.TB, l *txlimit.Limiter[TTx], name, key string, want float64, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.Check(ctx, name, key, reading(opts)...)
	requireRemaining(t, call("Check", name, key), want, res, err)
	return res
}

// RequireRemainingTx is RequireRemaining with l.CheckTx in tx: it sees what
// tx has taken and not committed yet.
func RequireRemainingTx[TTx any](t testing.TB, l *txlimit.Limiter[TTx], tx TTx, name, key string, want float64, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	ctx, cancel := callContext()
	defer cancel()
	res, err := l.CheckTx(ctx, tx, name, key, reading(opts)...)
	requireRemaining(t, call("CheckTx", name, key), want, res, err)
	return res
}

// reading is opts for a Check that reads a limit: Count(0) last, which asks
// for no token, so that a limit of any Capacity is read and a Count among
// opts is not used.
func reading(opts []txlimit.Option) []txlimit.Option {
	return append(opts[:len(opts):len(opts)], txlimit.Count(0))
}

func requireRemaining(t testing.TB, c string, want float64, res txlimit.Result, err error) {
	t.Helper()
	switch {
	case err != nil:
		t.Fatalf("%s: want %v tokens, got error: %v", c, want, explain(err))
	case res.FailedOpen:
		t.Fatalf("%s: want %v tokens, got a grant by Options.FailOpen: the store failed (the error went to Options.Observer)", c, want)
	case !equal(res.Remaining, want):
		t.Fatalf("%s: want %v tokens, got %v at %s", c, want, res.Remaining, at(res.At))
	}
}

// RequireRollbackRestores checks txlimit's promise that a transaction that
// rolls back spends nothing. It reads the limit (l.Check with Count(0), as
// RequireRemaining does), begins a
// transaction with begin, calls fn with it (fn runs the code under test,
// which takes from the limit in the transaction: LimitTx, LimitAllTx,
// CreditTx, ResetTx, or the application's own function that calls them),
// requires that the limit reads differently inside the transaction, rolls
// the transaction back, and requires that the limit then reads as it did
// before. It ends the test when fn changed nothing (the rollback would prove
// nothing), when the rollback did not restore the limit, or on an error.
// Only Inline is used among opts.
//
// begin is db.Begin for a *sql.DB, or a function that calls pool.Begin(ctx)
// for pgx. The transaction is rolled back with its Rollback method (pgx.Tx's
// Rollback(ctx) or *sql.Tx's Rollback()), also when fn ends the test. fn must
// leave the transaction usable: on PostgreSQL a statement that fails aborts
// the transaction, and the reading inside it fails. To test a path on which
// the application's own code fails and rolls back, read RequireRemaining
// before and after calling it instead.
//
// Both readings are compared at one clock reading: give the limiter a Clock
// (Options.Clock) that fn does not move. With the real clock, a limit that
// is not full refills between the two readings, and the assertion fails,
// saying so.

func RequireRollbackRestores[TTx any](t testing.TB, l *txlimit.Limiter[TTx], begin func() (TTx, error), name, key string, fn func(tx TTx), opts ...txlimit.Option) {
	t.Helper()
	c := fmt.Sprintf("txlimittest: RequireRollbackRestores(%q, %q)", name, key)
	value := func(when string) txlimit.Result {
		t.Helper()
		ctx, cancel := callContext()
		defer cancel()
		res, err := l.Check(ctx, name, key, reading(opts)...)
		switch {
		case err != nil:
			t.Fatalf("%s: Check %s: %v", c, when, explain(err))
		case res.FailedOpen:
			t.Fatalf("%s: Check %s: a grant by Options.FailOpen: the store failed (the error went to Options.Observer)", c, when)
		}
		return res
	}
	before := value("before the transaction")
	tx, err := begin()
	if err != nil {
		t.Fatalf("%s: begin: %v", c, err)
	}
	rollback, err := rollbackFunc(tx)
	if err != nil {
		t.Fatalf("%s: %v", c, err)
	}
	rolledBack := false
	defer func() {
		if !rolledBack { // fn or a check below ended the test
			_ = rollback()
		}
	}()
	fn(tx)
	ctx, cancel := callContext()
	inside, err := l.CheckTx(ctx, tx, name, key, reading(opts)...)
	cancel()
	if err != nil {
		t.Fatalf("%s: CheckTx in the transaction, after fn: %v (fn must leave the transaction open and usable; on PostgreSQL a statement that fails aborts it)", c, explain(err))
	}
	if equal(inside.Remaining, before.Remaining) {
		t.Fatalf("%s: fn changed nothing in the transaction: the limit holds %v tokens before it and in it, so a rollback proves nothing; "+
			"fn should take from the limit in the transaction it is given (LimitTx)", c, before.Remaining)
	}
	rolledBack = true
	if err := rollback(); err != nil {
		t.Fatalf("%s: rollback: %v", c, err)
	}
	after := value("after the rollback")
	if equal(after.Remaining, before.Remaining) {
		return
	}
	if !after.At.Equal(before.At) {
		t.Fatalf("%s: the limit holds %v tokens after the rollback and held %v before the transaction (%v in it), "+
			"but the clock moved between the readings, from %s to %s: give the limiter a txlimittest.Clock (Options.Clock) that fn does not move",
			c, after.Remaining, before.Remaining, inside.Remaining, at(before.At), at(after.At))
	}
	t.Fatalf("%s: the rollback did not restore the limit: it holds %v tokens after the rollback, %v before the transaction and %v in it, at %s",
		c, after.Remaining, before.Remaining, inside.Remaining, at(after.At))
}

// rollbackFunc returns the rollback of tx: the transaction types of
// txlimit's stores are pgx.Tx and *sql.Tx.
func rollbackFunc(tx any) (func() error, error) {
	switch tx := tx.(type) {
	case interface{ Rollback(context.Context) error }:
		return func() error {
			ctx, cancel := callContext()
			defer cancel()
			return tx.Rollback(ctx)
		}, nil
	case interface{ Rollback() error }:
		return tx.Rollback, nil
	}
	return nil, fmt.Errorf("begin returned a %T, which has neither Rollback(context.Context) error (pgx.Tx) nor Rollback() error (*sql.Tx)", tx)
}

// Prune runs l.Prune with opts (nil for the defaults) until it reaches the
// last key, and returns the sums of what the calls did, with Complete set.
// opts.MaxBatches then only sets how many batches each call runs. It ends
// the test on an error. Prune starts where the Limiter's previous Prune
// stopped, which is the first key unless a Prune of the test's own stopped
// early (PruneResult.Complete false).
//
// Prune deletes the rows of limits that are full again at the limiter's
// clock: with a Clock, Advance it past the time the limit takes to refill
// first.
func Prune[TTx any](t testing.TB, l *txlimit.Limiter[TTx], opts *txlimit.PruneOptions) txlimit.PruneResult {
	t.Helper()
	var sum txlimit.PruneResult
	for {
		ctx, cancel := callContext()
		r, err := l.Prune(ctx, opts)
		cancel()
		if err != nil {
			t.Fatalf("txlimittest: Prune: %v", explain(err))
		}
		sum.Deleted += r.Deleted
		sum.Keys += r.Keys
		sum.Unknown += r.Unknown
		sum.Batches += r.Batches
		if r.Complete {
			sum.Complete = true
			return sum
		}
	}
}

func callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// explain adds to the error of a call that ran out of time its likely
// cause.
func explain(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("%v (after %v: does a transaction of the test that is still open hold the key? "+
			"A form without Tx waits for it; in that transaction, use the Tx form)", err, callTimeout)
	}
	return err.Error()
}

// call names an operation on (name, key) in a failure message.
func call(op, name, key string) string {
	return fmt.Sprintf("txlimittest: %s(%q, %q)", op, name, key)
}

// counts describes the tokens of a Result in a failure message.
func counts(res txlimit.Result) string {
	s := ""
	if res.Count != 1 {
		s = fmt.Sprintf(" for Count %v", res.Count)
	}
	if res.Partial {
		return s + " (Remaining unknown: Partial)"
	}
	return s + fmt.Sprintf(" (Remaining %v)", res.Remaining)
}

func at(t time.Time) string { return t.Format(time.RFC3339Nano) }

// equal reports whether two token counts are equal to within tolerance,
// relative above one token.
func equal(got, want float64) bool {
	return math.Abs(got-want) <= tolerance*max(1, math.Abs(want))
}
