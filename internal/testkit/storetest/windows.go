package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
)

// env is what the windows topic calls a store through.
type env[TTx any] struct {
	h   Harness[TTx]
	ctx context.Context
}

func (e env[TTx]) limiter(t *testing.T, limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
	t.Helper()
	l, err := txlimit.New(e.h.Store, limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	return l
}

// inTx runs fn in a transaction of the harness and commits it.
func (e env[TTx]) inTx(t *testing.T, fn func(tx TTx)) {
	t.Helper()
	tx := e.h.Begin(t)
	fn(tx)
	require.NoError(t, e.h.Commit(tx))
}

// limit is LimitTx in a transaction of its own, committed.
func (e env[TTx]) limit(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	var res txlimit.Result
	e.inTx(t, func(tx TTx) {
		var err error
		res, err = l.LimitTx(e.ctx, tx, name, key, opts...)
		require.NoError(t, err)
	})
	return res
}

// value is the tokens (name, key) holds: CheckTx's Remaining, asking for
// no token.
func (e env[TTx]) value(t *testing.T, l *txlimit.Limiter[TTx], name, key string) float64 {
	t.Helper()
	var v float64
	e.inTx(t, func(tx TTx) {
		res, err := l.CheckTx(e.ctx, tx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		v = res.Remaining
	})
	return v
}

// requireRetryAfter requires the denial res to be exact: the same call is
// denied 1µs before res.RetryAfter has passed and granted once it has.
func (e env[TTx]) requireRetryAfter(t *testing.T, l *txlimit.Limiter[TTx], clk *Clock, res txlimit.Result, want time.Duration, name, key string, opts ...txlimit.Option) {
	t.Helper()
	require.False(t, res.OK)
	require.Equal(t, want, res.RetryAfter)
	clk.Advance(want - time.Microsecond)
	require.False(t, e.limit(t, l, name, key, opts...).OK, "denied 1µs before RetryAfter")
	clk.Advance(time.Microsecond)
	require.True(t, e.limit(t, l, name, key, opts...).OK, "granted at RetryAfter")
}

// runWindows is the suite's topic for the sliding window, calendar windows
// and UpTo, and for the calls that must write nothing: a reservation
// refused as invalid, a clock the database cannot hold.
func runWindows[TTx any](t *testing.T, h Harness[TTx]) {
	e := env[TTx]{h: h, ctx: context.Background()}
	minute := T0.Truncate(time.Hour) // a window boundary of every minute

	t.Run("SlidingWindowBoundary", func(t *testing.T) {
		// 10 calls at 12:00:59 under 10 a minute: at 12:01:01 a fixed
		// window would admit 10 more; the sliding window admits none, and
		// the next call at 12:01:06 exactly (the previous window's 10
		// weigh 10·54/60 = 9 then).
		name := UniqueName(t, "sliding")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.SlidingWindow, Rate: 10, Period: time.Minute, Start: minute}}, clk)
		clk.Advance(59 * time.Second)
		for i := range 10 {
			require.True(t, e.limit(t, l, name, "k").OK, "call %d", i)
		}
		require.False(t, e.limit(t, l, name, "k").OK)
		clk.Advance(2 * time.Second)
		res := e.limit(t, l, name, "k")
		require.InDelta(t, 10.0/60, res.Remaining, 1e-9, "the previous window's 10 weigh 59/60 of them")
		e.requireRetryAfter(t, l, clk, res, 5*time.Second, name, "k")
		require.False(t, e.limit(t, l, name, "k").OK, "denied calls counted nothing, and the granted one counts")
	})

	t.Run("SlidingWindowDebt", func(t *testing.T) {
		// 25 reserved at 12:00 under 10 a minute: the debt passes from
		// window to window, paid at 10 a minute, never forgotten.
		name := UniqueName(t, "slidingdebt")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.SlidingWindow, Rate: 10, Period: time.Minute, Start: minute}}, clk)
		res := e.limit(t, l, name, "k", txlimit.Count(25), txlimit.Reserve())
		require.True(t, Reserved(res))
		require.Equal(t, 150*time.Second, res.RetryAfter)
		require.Equal(t, 25.0, res.Taken)
		clk.Advance(150 * time.Second)
		require.InDelta(t, 0, e.value(t, l, name, "k"), 1e-9)
		clk.Advance(90 * time.Second)
		require.InDelta(t, 10, e.value(t, l, name, "k"), 1e-9)
	})

	t.Run("SlidingWindowShardsExact", func(t *testing.T) {
		// 24 a minute over 4 shards, callers at once: exactly 24 granted.
		name := UniqueName(t, "slidingshards")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.SlidingWindow, Rate: 24, Period: time.Minute, Shards: 4}}, clk)
		var granted atomic.Int64
		errs := make(chan error, 64)
		var wg sync.WaitGroup
		slots := make(chan struct{}, h.Conns-1)
		for range 8 {
			wg.Go(func() {
				for range 5 {
					slots <- struct{}{}
					tx := h.Begin(t)
					res, err := l.LimitTx(e.ctx, tx, name, "k")
					if err == nil {
						err = h.Commit(tx)
					} else {
						h.Rollback(tx)
					}
					<-slots
					switch {
					case err != nil:
						errs <- err
					case res.OK:
						granted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, 24, granted.Load())
		require.InDelta(t, 0, e.value(t, l, name, "k"), 1e-9)
	})

	t.Run("CalendarMonth", func(t *testing.T) {
		// 3 a month, months of Europe/Berlin: April starts at local
		// midnight, 22:00 UTC on March 31 (summer time began on March 29).
		name := UniqueName(t, "month")
		clk := NewClock()
		clk.Advance(time.Date(2026, 3, 31, 21, 0, 0, 0, time.UTC).Sub(clk.Now()))
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.Monthly, Rate: 3, Zone: "Europe/Berlin"}}, clk)
		for i := range 3 {
			require.True(t, e.limit(t, l, name, "k").OK, "call %d", i)
		}
		e.requireRetryAfter(t, l, clk, e.limit(t, l, name, "k"), time.Hour, name, "k")
		require.InDelta(t, 2, e.value(t, l, name, "k"), 1e-9, "April's 3, one taken")
	})

	t.Run("CalendarDayAcrossDST", func(t *testing.T) {
		// 1 a day in New York: March 8, 2026 has 23 hours.
		name := UniqueName(t, "day")
		clk := NewClock()
		clk.Advance(time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC).Sub(clk.Now())) // local midnight
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.Daily, Rate: 1, Zone: "America/New_York"}}, clk)
		require.True(t, e.limit(t, l, name, "k").OK)
		e.requireRetryAfter(t, l, clk, e.limit(t, l, name, "k"), 23*time.Hour, name, "k")
	})

	t.Run("UpTo", func(t *testing.T) {
		name := UniqueName(t, "upto")
		clk := NewClock()
		for _, kind := range []txlimit.Kind{txlimit.TokenBucket, txlimit.FixedWindow, txlimit.SlidingWindow} {
			for _, shards := range []int{1, 4} {
				key := fmt.Sprint(KindName(kind), shards)
				l := e.limiter(t, map[string]txlimit.Config{name: {Kind: kind, Rate: 10, Period: time.Minute, Shards: shards}}, clk)
				res := e.limit(t, l, name, key, txlimit.UpTo(7))
				require.True(t, res.OK, key)
				require.Equal(t, 7.0, res.Taken, key)
				require.Equal(t, 7.0, res.Count, key)
				res = e.limit(t, l, name, key, txlimit.UpTo(7))
				require.True(t, res.OK, key)
				require.Equal(t, 3.0, res.Taken, "%s: what there was", key)
				before := h.Rows(t, name, key)
				res = e.limit(t, l, name, key, txlimit.UpTo(7))
				require.False(t, res.OK, key)
				require.Zero(t, res.Taken, key)
				require.Positive(t, res.RetryAfter, key)
				require.Equal(t, before, h.Rows(t, name, key), "%s: a denial writes nothing", key)
			}
		}
	})

	t.Run("UpToLimitAll", func(t *testing.T) {
		// Up-to limits of one call take the same amount: the least any of
		// them has. A fixed count beside them is taken whole.
		a, b, c := UniqueName(t, "a"), UniqueName(t, "b"), UniqueName(t, "c")
		clk := NewClock()
		cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour}
		l := e.limiter(t, map[string]txlimit.Config{a: cfg, b: cfg, c: cfg}, clk)
		require.True(t, e.limit(t, l, a, "k", txlimit.Count(5)).OK)
		require.True(t, e.limit(t, l, b, "k", txlimit.Count(7)).OK)
		var m txlimit.MultiResult
		e.inTx(t, func(tx TTx) {
			var err error
			m, err = l.LimitAllTx(e.ctx, tx,
				txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.UpTo(4)}},
				txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.UpTo(4)}},
				txlimit.Request{Name: c, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}})
			require.NoError(t, err)
		})
		require.True(t, m.OK)
		require.Equal(t, []float64{3, 3, 2}, []float64{m.Results[0].Taken, m.Results[1].Taken, m.Results[2].Taken})
		require.InDelta(t, 2, e.value(t, l, a, "k"), 1e-9)
		require.InDelta(t, 0, e.value(t, l, b, "k"), 1e-9)
		require.InDelta(t, 8, e.value(t, l, c, "k"), 1e-9)
		// b has nothing left: the call is denied, and nothing is taken.
		e.inTx(t, func(tx TTx) {
			var err error
			m, err = l.LimitAllTx(e.ctx, tx,
				txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.UpTo(4)}},
				txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.UpTo(4)}})
			require.NoError(t, err)
		})
		require.False(t, m.OK)
		require.Zero(t, m.Results[0].Taken+m.Results[1].Taken)
		require.InDelta(t, 2, e.value(t, l, a, "k"), 1e-9)
	})

	t.Run("UpToInvalid", func(t *testing.T) {
		name := UniqueName(t, "uptobad")
		clk := NewClock()
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}}, clk)
		for _, opts := range [][]txlimit.Option{
			{txlimit.UpTo(3), txlimit.Reserve()},
			{txlimit.UpTo(-1)},
		} {
			e.inTx(t, func(tx TTx) {
				_, err := l.LimitTx(e.ctx, tx, name, "k", opts...)
				var inv *txlimit.InvalidError
				require.ErrorAs(t, err, &inv)
				require.Equal(t, "UpTo", inv.Field)
			})
			require.Empty(t, h.Rows(t, name, "k"))
		}
	})

	t.Run("RefusedReservationWritesNothing", func(t *testing.T) {
		// A reservation whose debt would take longer than MaxWait to repay
		// is an *InvalidError: nothing is written, on a new key as on one
		// that has rows, and the transaction commits with nothing of it.
		name := UniqueName(t, "maxwait")
		clk := NewClock()
		for _, shards := range []int{1, 2} {
			key := fmt.Sprint("shards", shards)
			l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: 100 * 365 * 24 * time.Hour, Capacity: 2, Shards: shards}}, clk)
			refused := func() {
				e.inTx(t, func(tx TTx) {
					_, err := l.LimitTx(e.ctx, tx, name, key, txlimit.Count(100), txlimit.Reserve())
					var inv *txlimit.InvalidError
					require.ErrorAs(t, err, &inv)
					require.Equal(t, "Count", inv.Field)
				})
			}
			refused()
			require.Empty(t, h.Rows(t, name, key), "a new key gets no row")
			require.True(t, e.limit(t, l, name, key).OK)
			before := h.Rows(t, name, key)
			refused()
			require.Equal(t, before, h.Rows(t, name, key))
		}
	})

	t.Run("ClockOutOfRange", func(t *testing.T) {
		// A test clock the database cannot hold is an *InvalidError that
		// names it, before any statement, whatever the call; the first and
		// the last instant the store says it holds work. Year 300000 is
		// past every store (microseconds in an int64 end in 294247).
		name := UniqueName(t, "clock")
		out := []time.Time{time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}
		var in []time.Time
		if r, ok := h.Store.(driver.ClockRanger); ok {
			first, last := r.ClockRange()
			out = append(out, first.Add(-time.Microsecond), last.Add(time.Microsecond))
			in = append(in, first, last)
		}
		limiter := func(at time.Time) *txlimit.Limiter[TTx] {
			l, err := txlimit.New(h.Store, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}},
				&txlimit.Options{Clock: func() time.Time { return at }})
			require.NoError(t, err)
			return l
		}
		for _, at := range out {
			l := limiter(at)
			e.inTx(t, func(tx TTx) {
				requireClock := func(err error) {
					t.Helper()
					var inv *txlimit.InvalidError
					require.ErrorAs(t, err, &inv, "clock %v", at)
					require.Equal(t, "Options.Clock", inv.Field)
				}
				_, err := l.LimitTx(e.ctx, tx, name, "k")
				requireClock(err)
				_, err = l.CheckTx(e.ctx, tx, name, "k")
				requireClock(err)
				_, err = l.CheckTx(e.ctx, tx, name, "k", txlimit.Count(0))
				requireClock(err)
				requireClock(l.CreditTx(e.ctx, tx, name, "k", 1))
				_, err = l.LimitAllTx(e.ctx, tx, txlimit.Request{Name: name, Key: "k"})
				requireClock(err)
			})
			// Options.Clock's error, or a store without a pool's: both
			// bad input.
			_, err := l.Prune(e.ctx, nil)
			require.ErrorAs(t, err, new(*txlimit.InvalidError))
			require.Empty(t, h.Rows(t, name, "k"))
		}
		for i, at := range in {
			l := limiter(at)
			key := fmt.Sprint("in", i)
			require.True(t, e.limit(t, l, name, key).OK, "clock %v", at)
			e.inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(e.ctx, tx, name, key)) })
		}
	})
}
