package storetest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// repeaters is how many transactions repeat one idempotency key at once in
// ConcurrentRepeatsTakeOnce, each on a connection of its own.
const repeaters = 32

// runIdempotent is the suite's topic for idempotent takes
// (txlimit.Idempotent): a repeat takes nothing and returns the first
// call's result, in the caller's transaction and in the Limiter's own, and
// in LimitAll; a repeat of another request is refused; a rollback or a
// denial leaves the key unused; the window expires; Prune deletes the
// expired keys; and 32 concurrent repeats take exactly once.
func runIdempotent[TTx any](t *testing.T, h Harness[TTx], newHarness func(t *testing.T, conns int32) Harness[TTx]) {
	ctx := context.Background()
	e := env[TTx]{h: h, ctx: ctx}
	bucket := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour}
	leave := enterShared(t)
	defer func() {
		if leave != nil {
			leave()
		}
	}()
	// limitTx is LimitTx in a transaction of its own, committed.
	limitTx := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) (txlimit.Result, error) {
		t.Helper()
		var res txlimit.Result
		var err error
		e.inTx(t, func(tx TTx) { res, err = l.LimitTx(ctx, tx, name, key, opts...) })
		return res, err
	}

	t.Run("RepeatReturnsTheFirstResult", func(t *testing.T) {
		name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, clk)
		first, err := limitTx(t, l, name, "k", txlimit.Count(3), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, first.OK)
		require.False(t, first.Repeat)
		require.Equal(t, 3.0, first.Taken)
		require.InDelta(t, 7, first.Remaining, 1e-9)
		clk.Advance(time.Minute) // refills 10/60 of a token: a repeat still reports the first call's
		for _, own := range []bool{false, true} {
			var again txlimit.Result
			if own {
				again, err = l.Limit(ctx, name, "k", txlimit.Count(3), txlimit.Idempotent(idem, time.Hour))
				if noPool(err) {
					continue
				}
			} else {
				again, err = limitTx(t, l, name, "k", txlimit.Count(3), txlimit.Idempotent(idem, time.Hour))
			}
			require.NoError(t, err)
			require.True(t, again.Repeat, "own transaction %v", own)
			again.Repeat = false
			require.Equal(t, first, again, "own transaction %v: the first call's Result", own)
		}
		require.InDelta(t, 7+10.0/60, e.value(t, l, name, "k"), 1e-9, "taken once")

		// A reservation's RetryAfter is the first call's too.
		idem2 := UniqueName(t, "idem")
		res, err := limitTx(t, l, name, "k", txlimit.Count(12), txlimit.Reserve(), txlimit.Idempotent(idem2, time.Hour))
		require.NoError(t, err)
		require.True(t, Reserved(res))
		clk.Advance(time.Minute)
		again, err := limitTx(t, l, name, "k", txlimit.Count(12), txlimit.Reserve(), txlimit.Idempotent(idem2, time.Hour))
		require.NoError(t, err)
		require.True(t, again.Repeat)
		require.Equal(t, res.RetryAfter, again.RetryAfter)
		require.InDelta(t, res.Remaining+10.0/60, e.value(t, l, name, "k"), 1e-9, "reserved once")
	})

	t.Run("MismatchIsRefused", func(t *testing.T) {
		name, other, idem := UniqueName(t, "tb"), UniqueName(t, "other"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket, other: bucket}, clk)
		_, err := limitTx(t, l, name, "k", txlimit.Count(2), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		for _, tc := range []struct {
			what      string
			name, key string
			opts      []txlimit.Option
		}{
			{"another count", name, "k", []txlimit.Option{txlimit.Count(3)}},
			{"UpTo", name, "k", []txlimit.Option{txlimit.UpTo(2)}},
			{"another limit", other, "k", []txlimit.Option{txlimit.Count(2)}},
			{"another key", name, "k2", []txlimit.Option{txlimit.Count(2)}},
		} {
			res, err := limitTx(t, l, tc.name, tc.key, append(tc.opts, txlimit.Idempotent(idem, time.Hour))...)
			require.ErrorIs(t, err, txlimit.ErrIdempotencyMismatch, tc.what)
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv, tc.what)
			require.Equal(t, "Idempotent", inv.Field)
			require.Contains(t, err.Error(), idem)
			require.Equal(t, txlimit.Result{}, res)
		}
		// LimitAll of the same limit is another request too.
		e.inTx(t, func(tx TTx) {
			_, err := l.LimitAllTx(ctx, tx, txlimit.Request{Name: name, Key: "k",
				Options: []txlimit.Option{txlimit.Count(2), txlimit.Idempotent(idem, time.Hour)}})
			require.ErrorIs(t, err, txlimit.ErrIdempotencyMismatch)
		})
		require.InDelta(t, 8, e.value(t, l, name, "k"), 1e-9, "the refused calls took nothing")
		require.InDelta(t, 10, e.value(t, l, other, "k"), 1e-9)
		require.InDelta(t, 10, e.value(t, l, name, "k2"), 1e-9)
	})

	t.Run("WindowExpires", func(t *testing.T) {
		name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: 10, Period: 24 * time.Hour, Start: T0}}, clk)
		take := func() txlimit.Result {
			res, err := limitTx(t, l, name, "k", txlimit.Idempotent(idem, time.Minute))
			require.NoError(t, err)
			require.True(t, res.OK)
			return res
		}
		require.False(t, take().Repeat)
		clk.Advance(time.Minute - time.Microsecond)
		require.True(t, take().Repeat, "within the window")
		clk.Advance(time.Microsecond)
		require.False(t, take().Repeat, "the window has passed: the key is unused")
		require.True(t, take().Repeat, "a window from the second take")
		require.InDelta(t, 8, e.value(t, l, name, "k"), 1e-9, "taken twice")
	})

	t.Run("RollbackLeavesTheKeyUnused", func(t *testing.T) {
		name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, clk)
		tx := h.Begin(t)
		res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Count(4), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, res.OK)
		h.Rollback(tx)
		res, err = limitTx(t, l, name, "k", txlimit.Count(4), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, res.OK)
		require.False(t, res.Repeat, "the rolled back call took nothing and recorded nothing")
		require.InDelta(t, 6, e.value(t, l, name, "k"), 1e-9)
	})

	t.Run("RepeatWaitsForTheFirstToRollBack", func(t *testing.T) {
		// A repeat that comes while the first call's transaction is open
		// waits for it; when it rolls back, the repeat takes itself.
		name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, clk)
		first := h.Begin(t)
		res, err := l.LimitTx(ctx, first, name, "k", txlimit.Count(4), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, res.OK)
		type outcome struct {
			res txlimit.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			tx, err := h.TryBegin(ctx) // SQLite's write lock waits here, the others at the claim
			if err != nil {
				done <- outcome{err: err}
				return
			}
			res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Count(4), txlimit.Idempotent(idem, time.Hour))
			if err != nil {
				h.Rollback(tx)
			} else {
				err = h.Commit(tx)
			}
			done <- outcome{res, err}
		}()
		select {
		case o := <-done:
			t.Fatalf("the repeat returned while the first call's transaction was open: %+v", o)
		case <-time.After(200 * time.Millisecond):
		}
		h.Rollback(first)
		o := <-done
		require.NoError(t, o.err)
		require.True(t, o.res.OK)
		require.False(t, o.res.Repeat, "the first call rolled back: the repeat took")
		require.InDelta(t, 6, e.value(t, l, name, "k"), 1e-9, "taken once")
	})

	t.Run("DenialLeavesTheKeyUnused", func(t *testing.T) {
		name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, clk)
		_, err := limitTx(t, l, name, "k", txlimit.Count(9))
		require.NoError(t, err)
		res, err := limitTx(t, l, name, "k", txlimit.Count(2), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.False(t, res.OK)
		require.False(t, res.Repeat)
		require.Equal(t, 6*time.Minute, res.RetryAfter)
		clk.Advance(res.RetryAfter)
		res, err = limitTx(t, l, name, "k", txlimit.Count(2), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, res.OK, "a retry after RetryAfter is decided afresh")
		require.False(t, res.Repeat)
		res, err = limitTx(t, l, name, "k", txlimit.Count(2), txlimit.Idempotent(idem, time.Hour))
		require.NoError(t, err)
		require.True(t, res.Repeat)
		require.InDelta(t, 0, e.value(t, l, name, "k"), 1e-9)
	})

	t.Run("LimitAll", func(t *testing.T) {
		a, b, idem := UniqueName(t, "a"), UniqueName(t, "b"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{a: bucket, b: {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour}}, clk)
		reqs := []txlimit.Request{
			{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(2), txlimit.Idempotent(idem, time.Hour)}},
			{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(3)}},
		}
		var first, again txlimit.MultiResult
		e.inTx(t, func(tx TTx) {
			var err error
			first, err = l.LimitAllTx(ctx, tx, reqs...)
			require.NoError(t, err)
		})
		require.True(t, first.OK)
		require.False(t, first.Results[0].Repeat)
		e.inTx(t, func(tx TTx) {
			var err error
			again, err = l.LimitAllTx(ctx, tx, reqs...)
			require.NoError(t, err)
		})
		for i := range again.Results {
			require.True(t, again.Results[i].Repeat)
			again.Results[i].Repeat = false
		}
		require.Equal(t, first, again)
		require.InDelta(t, 8, e.value(t, l, a, "k"), 1e-9, "taken once")
		require.InDelta(t, 2, e.value(t, l, b, "k"), 1e-9, "taken once")

		// Requests that disagree on the key, and the forms that decide at
		// COMMIT, are refused before anything is written.
		e.inTx(t, func(tx TTx) {
			_, err := l.LimitAllTx(ctx, tx, reqs[0], txlimit.Request{Name: b, Key: "k",
				Options: []txlimit.Option{txlimit.Idempotent(idem+"x", time.Hour)}})
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, "Idempotent", inv.Field)
		})
		tx := h.Begin(t)
		_, err := l.CommitTx(ctx, tx, reqs...)
		h.Rollback(tx)
		var inv *txlimit.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "Idempotent", inv.Field)
		require.Contains(t, inv.Problem, "LimitAllTx")
		require.InDelta(t, 8, e.value(t, l, a, "k"), 1e-9)
	})

	t.Run("Prune", func(t *testing.T) {
		name, prefix := UniqueName(t, "tb"), UniqueName(t, "idem")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, clk)
		for i := range 3 {
			_, err := limitTx(t, l, name, fmt.Sprint(i), txlimit.Idempotent(fmt.Sprintf("%s-%d", prefix, i), time.Minute))
			require.NoError(t, err)
		}
		_, err := limitTx(t, l, name, "kept", txlimit.Idempotent(prefix+"-kept", 3*time.Minute))
		require.NoError(t, err)
		count := func() int64 {
			var n int64
			e.inTx(t, func(tx TTx) {
				var err error
				n, err = h.QueryInt(ctx, tx, "SELECT count(*) FROM txlimit_idempotency WHERE id LIKE "+sqlString(prefix+"-%"))
				require.NoError(t, err)
			})
			return n
		}
		require.EqualValues(t, 4, count())
		clk.Advance(2 * time.Minute)
		_, err = l.Prune(ctx, nil)
		if noPool(err) {
			return
		}
		require.NoError(t, err)
		require.EqualValues(t, 1, count(), "the expired keys are deleted, the live one kept")
		res, err := limitTx(t, l, name, "kept", txlimit.Idempotent(prefix+"-kept", 3*time.Minute))
		require.NoError(t, err)
		require.True(t, res.Repeat)
	})

	t.Run("BadInput", func(t *testing.T) {
		name := UniqueName(t, "tb")
		l := e.limiter(t, map[string]txlimit.Config{name: bucket}, NewClock())
		for _, opt := range []txlimit.Option{
			txlimit.Idempotent("", time.Hour),
			txlimit.Idempotent(string(make([]byte, 257)), time.Hour),
			txlimit.Idempotent("a\x00b", time.Hour),
			txlimit.Idempotent("k", 0),
			txlimit.Idempotent("k", -time.Second),
		} {
			_, err := limitTx(t, l, name, "k", opt)
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, "Idempotent", inv.Field)
		}
		e.inTx(t, func(tx TTx) {
			_, err := l.CheckTx(ctx, tx, name, "k", txlimit.Idempotent("k", time.Hour))
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv)
			require.ErrorAs(t, l.CreditTx(ctx, tx, name, "k", 1, txlimit.Idempotent("k", time.Hour)), &inv)
		})
		require.Empty(t, h.Rows(t, name, "k"), "nothing written")
	})

	leave()
	leave = nil
	t.Run("ConcurrentRepeatsTakeOnce", func(t *testing.T) {
		require.NotNil(t, h.BeginLevel, "the harness says how to begin at an isolation level")
		enterAlone(t, h)
		big := newHarness(t, repeaters+1)
		for _, level := range h.Levels {
			t.Run(levelName(level), func(t *testing.T) { repeatsTakeOnce(t, big, &level) })
		}
		t.Run("own_transactions", func(t *testing.T) { repeatsTakeOnce(t, big, nil) })
	})
}

// repeatsTakeOnce runs repeaters calls with one idempotency key at once,
// each on a connection of its own: LimitTx in transactions at *level, or,
// when level is nil, Limit. Exactly one takes; every other returns its
// Result, marked Repeat. A call that fails with an error the store calls
// retryable (a serialization failure, a deadlock, a busy SQLite database)
// runs again, as an application runs it again.
func repeatsTakeOnce[TTx any](t *testing.T, h Harness[TTx], level *sql.IsolationLevel) {
	ctx := context.Background()
	name, idem := UniqueName(t, "tb"), UniqueName(t, "idem")
	l, err := txlimit.New(h.Store, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 100, Period: 24 * time.Hour}}, nil)
	require.NoError(t, err)
	opts := []txlimit.Option{txlimit.Count(3), txlimit.Idempotent(idem, time.Hour)}
	call := func() (txlimit.Result, error) {
		if level == nil {
			return l.Limit(ctx, name, "k", opts...)
		}
		tx, err := h.BeginLevel(ctx, *level)
		if err != nil {
			return txlimit.Result{}, err
		}
		res, err := l.LimitTx(ctx, tx, name, "k", opts...)
		if err != nil {
			h.Rollback(tx)
			return res, err
		}
		return res, h.Commit(tx)
	}
	if level == nil {
		if _, err := l.Check(ctx, name, "k"); noPool(err) {
			t.Skip("the store has no pool: Limit is not available")
		}
	}
	results := make([]txlimit.Result, repeaters)
	retried := together(t, h, repeaters, func(i int) (err error) {
		results[i], err = call()
		return err
	})
	t.Logf("%d retryable failures run again", retried)
	var first txlimit.Result
	firsts := 0
	for _, res := range results {
		if !res.Repeat {
			first = res
			firsts++
		}
	}
	require.Equal(t, 1, firsts, "exactly one call took")
	require.True(t, first.OK)
	require.Equal(t, 3.0, first.Taken)
	require.InDelta(t, 97, first.Remaining, 1e-6)
	for i, res := range results {
		res.Repeat = false
		require.Equal(t, first, res, "call %d returns the first call's Result", i)
	}
	e := env[TTx]{h: h, ctx: ctx}
	e.inTx(t, func(tx TTx) {
		res, err := l.CheckTx(ctx, tx, name, "k", txlimit.Count(0))
		require.NoError(t, err)
		require.InDelta(t, 97, res.Remaining, 0.01, "3 taken, once (and a little refill)")
	})
}
