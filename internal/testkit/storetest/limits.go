package storetest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runLimits is the suite's topic for the core: both kinds of limit, what a
// denial, a rollback, a credit, a clock and bad input do to the stored
// state, and concurrent callers on one hot limit.
func runLimits[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()

	newLimiter := func(t *testing.T, limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
		t.Helper()
		var opts *txlimit.Options
		if clk != nil {
			opts = &txlimit.Options{Clock: clk.Now}
		}
		l, err := txlimit.New(h.Store, limits, opts)
		require.NoError(t, err)
		return l
	}
	// inTx runs fn in a transaction of the harness and commits it.
	inTx := func(t *testing.T, fn func(tx TTx)) {
		t.Helper()
		tx := h.Begin(t)
		fn(tx)
		require.NoError(t, h.Commit(tx))
	}
	limitTx := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		var res txlimit.Result
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.LimitTx(ctx, tx, name, key, opts...)
			require.NoError(t, err)
		})
		return res
	}

	t.Run("TokenBucket", func(t *testing.T) {
		name := UniqueName(t, "tb")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}}, clk)
		for i := range 10 {
			res := limitTx(t, l, name, "u1")
			require.True(t, res.OK, "call %d", i)
			require.Zero(t, res.RetryAfter)
			require.WithinDuration(t, clk.Now(), res.At, 0)
		}
		res := limitTx(t, l, name, "u1")
		require.False(t, res.OK)
		require.Equal(t, 6*time.Second, res.RetryAfter)
		require.ErrorIs(t, res.Err(), txlimit.ErrRateLimited)
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, res.Err(), &rl)
		require.Equal(t, name, rl.Name)
		require.Equal(t, "u1", rl.Key)
		require.Equal(t, 6*time.Second, rl.RetryAfter)

		// Another key is another bucket.
		require.True(t, limitTx(t, l, name, "u2").OK)

		clk.Advance(6*time.Second - time.Microsecond)
		require.False(t, limitTx(t, l, name, "u1").OK)
		clk.Advance(time.Microsecond)
		require.True(t, limitTx(t, l, name, "u1").OK)
		require.False(t, limitTx(t, l, name, "u1").OK)

		// A long idle refills to Capacity and no further.
		clk.Advance(time.Hour)
		snap, err := l.Check(ctx, name, "u1", txlimit.Count(0))
		if noPool(err) {
			inTx(t, func(tx TTx) { snap, err = l.CheckTx(ctx, tx, name, "u1", txlimit.Count(0)) })
		}
		require.NoError(t, err)
		require.Equal(t, 10.0, snap.Remaining)
		require.WithinDuration(t, clk.Now(), snap.At, 0)
		require.True(t, limitTx(t, l, name, "u1", txlimit.Count(10)).OK)
		require.False(t, limitTx(t, l, name, "u1", txlimit.Count(0.5)).OK)
	})

	t.Run("FixedWindow", func(t *testing.T) {
		name := UniqueName(t, "fw")
		clk := NewClock()
		start := T0.Add(-30 * time.Minute) // windows start at :30
		l := newLimiter(t, map[string]txlimit.Config{name: {
			Kind: txlimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 150, Start: start,
		}}, clk)
		// A new key starts full: 150.
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(80)).OK) // 70 left
		res := limitTx(t, l, name, "k", txlimit.Count(71))
		require.False(t, res.OK)
		require.Equal(t, 30*time.Minute, res.RetryAfter, "the next window starts at 12:30")
		// Mid-window nothing is added.
		clk.Advance(29 * time.Minute)
		require.False(t, limitTx(t, l, name, "k", txlimit.Count(71)).OK)
		// The next window adds Rate, capped at Capacity: 70+100 → 150.
		clk.Advance(time.Minute)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(150)).OK)
		res = limitTx(t, l, name, "k", txlimit.Count(150))
		require.False(t, res.OK)
		require.Equal(t, 2*time.Hour, res.RetryAfter, "two windows of 100 are needed for 150")
	})

	t.Run("DeniedMultiTokenTakesNothing", func(t *testing.T) {
		// A token bucket of 10: 7 taken, then 5 denied, which must take
		// nothing (upstash/ratelimit PR #156 fixed a take of the 3 there
		// were): 3 more are granted and leave 0. Every path of the take:
		// one row, shards (7 and 5 above a shard's 2.5: every shard
		// locked), LimitAll and an unsharded sliding window beside it.
		name := UniqueName(t, "multi")
		clk := NewClock()
		for _, c := range []struct {
			kind   txlimit.Kind
			shards int
			all    bool
		}{
			{txlimit.TokenBucket, 1, false}, {txlimit.TokenBucket, 4, false},
			{txlimit.TokenBucket, 1, true}, {txlimit.TokenBucket, 4, true},
			{txlimit.SlidingWindow, 1, false},
		} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: c.kind, Rate: 10, Period: time.Hour, Shards: c.shards}}, clk)
			key := fmt.Sprintf("%s-shards%d-all%v", KindName(c.kind), c.shards, c.all)
			take := func(n float64) txlimit.Result {
				if !c.all {
					return limitTx(t, l, name, key, txlimit.Count(n))
				}
				var m txlimit.MultiResult
				inTx(t, func(tx TTx) {
					var err error
					m, err = l.LimitAllTx(ctx, tx, txlimit.Request{Name: name, Key: key, Options: []txlimit.Option{txlimit.Count(n)}})
					require.NoError(t, err)
				})
				return m.Results[0]
			}
			require.True(t, take(7).OK, key)
			before := h.Rows(t, name, key)
			res := take(5)
			require.False(t, res.OK, key)
			require.Zero(t, res.Taken, key)
			require.InDelta(t, 3, res.Remaining, 1e-9, "%s: the denial leaves the 3", key)
			if c.kind == txlimit.TokenBucket {
				require.Equal(t, 12*time.Minute, res.RetryAfter, "%s: 2 more tokens at 10 an hour", key)
			}
			require.Equal(t, before, h.Rows(t, name, key), "%s: a denial writes nothing", key)
			res = take(3)
			require.True(t, res.OK, key)
			require.InDelta(t, 0, res.Remaining, 1e-9, key)
			require.False(t, take(0.5).OK, "%s: nothing left", key)
		}
	})

	t.Run("FixedWindowPhaseIsStablePerKey", func(t *testing.T) {
		name := UniqueName(t, "phase")
		clk := NewClock()
		cfg := txlimit.Config{Kind: txlimit.FixedWindow, Rate: 1, Period: time.Hour}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
		retries := map[time.Duration]bool{}
		for _, key := range []string{"a", "b", "c", "d"} {
			// Before anything is written, Check and Limit agree on the
			// window: both report the same time to the next window.
			var chk txlimit.Result
			inTx(t, func(tx TTx) {
				var err error
				chk, err = l.CheckTx(ctx, tx, name, key, txlimit.Count(1))
				require.NoError(t, err)
			})
			require.True(t, chk.OK)
			require.True(t, limitTx(t, l, name, key).OK)
			inTx(t, func(tx TTx) {
				var err error
				chk, err = l.CheckTx(ctx, tx, name, key)
				require.NoError(t, err)
			})
			res := limitTx(t, l, name, key)
			require.False(t, res.OK)
			require.Equal(t, chk.RetryAfter, res.RetryAfter)
			require.Positive(t, res.RetryAfter)
			require.LessOrEqual(t, res.RetryAfter, time.Hour)
			retries[res.RetryAfter] = true
			// Resetting and starting again lands on the same phase.
			inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(ctx, tx, name, key)) })
			require.True(t, limitTx(t, l, name, key).OK)
			again := limitTx(t, l, name, key)
			require.Equal(t, res.RetryAfter, again.RetryAfter)
		}
		require.Greater(t, len(retries), 1, "keys should get different phases")
	})

	t.Run("DeniedCallWritesNothing", func(t *testing.T) {
		name := UniqueName(t, "deny")
		clk := NewClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			require.True(t, limitTx(t, l, name, key, txlimit.Count(3)).OK)
			before := h.Rows(t, name, key)
			require.Len(t, before, shards)
			clk.Advance(time.Second)
			res := limitTx(t, l, name, key, txlimit.Count(2))
			require.False(t, res.OK)
			require.Equal(t, before, h.Rows(t, name, key))
		}
	})

	t.Run("RollbackRestoresState", func(t *testing.T) {
		name := UniqueName(t, "rollback")
		clk := NewClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			// A rollback of the first call leaves no row at all.
			tx := h.Begin(t)
			res, err := l.LimitTx(ctx, tx, name, key, txlimit.Count(4))
			require.NoError(t, err)
			require.True(t, res.OK)
			h.Rollback(tx)
			require.Empty(t, h.Rows(t, name, key))

			require.True(t, limitTx(t, l, name, key, txlimit.Count(1)).OK)
			before := h.Rows(t, name, key)
			clk.Advance(time.Minute)
			tx = h.Begin(t)
			res, err = l.LimitTx(ctx, tx, name, key, txlimit.Count(3))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.NoError(t, l.CreditTx(ctx, tx, name, key, 1))
			require.NoError(t, l.ResetTx(ctx, tx, name, key+"-other"))
			h.Rollback(tx)
			require.Equal(t, before, h.Rows(t, name, key))
			// The tokens came back: 3 of the 4 are there (1 was spent).
			require.True(t, limitTx(t, l, name, key, txlimit.Count(3)).OK)
		}
	})

	t.Run("Reservations", func(t *testing.T) {
		name := UniqueName(t, "reserve")
		capped := UniqueName(t, "capped")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			name:   {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
			capped: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 2},
		}, clk)
		for i := range 4 {
			res := limitTx(t, l, name, "k", txlimit.Reserve())
			require.True(t, res.OK)
			require.NoError(t, res.Err(), "a reservation is never an error")
			require.Equal(t, time.Duration(i)*time.Second, res.RetryAfter)
			require.Equal(t, i > 0, Reserved(res))
		}
		// MaxReserved refuses the reservation that goes too deep, writing
		// nothing.
		for i := range 3 {
			res := limitTx(t, l, capped, "k", txlimit.Reserve())
			require.True(t, res.OK)
			require.Equal(t, time.Duration(i)*time.Second, res.RetryAfter)
		}
		before := h.Rows(t, capped, "k")
		res := limitTx(t, l, capped, "k", txlimit.Reserve())
		require.False(t, res.OK)
		require.Equal(t, time.Second, res.RetryAfter, "in 1s the debt is 1 and one more fits under MaxReserved")
		require.Equal(t, before, h.Rows(t, capped, "k"))
		// A rolled-back reservation frees its tokens.
		tx := h.Begin(t)
		res, err := l.LimitTx(ctx, tx, name, "rb", txlimit.Count(5), txlimit.Reserve())
		require.NoError(t, err)
		require.Equal(t, 4*time.Second, res.RetryAfter)
		h.Rollback(tx)
		res = limitTx(t, l, name, "rb")
		require.True(t, res.OK)
		require.Zero(t, res.RetryAfter)
	})

	t.Run("CreditIsCappedAtCapacity", func(t *testing.T) {
		name := UniqueName(t, "credit")
		clk := NewClock()
		for _, shards := range []int{1, 4} {
			l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: shards}}, clk)
			key := fmt.Sprint("shards", shards)
			require.True(t, limitTx(t, l, name, key, txlimit.Count(8)).OK)
			inTx(t, func(tx TTx) { require.NoError(t, l.CreditTx(ctx, tx, name, key, 3)) })
			var snap txlimit.Result
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.CheckTx(ctx, tx, name, key, txlimit.Count(0))
				require.NoError(t, err)
			})
			require.InDelta(t, 3.0, snap.Remaining, 1e-9)
			inTx(t, func(tx TTx) { require.NoError(t, l.CreditTx(ctx, tx, name, key, 100)) })
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.CheckTx(ctx, tx, name, key, txlimit.Count(0))
				require.NoError(t, err)
			})
			require.InDelta(t, 8.0, snap.Remaining, 1e-9)
			// Exactly 8, not 11: taking 8.25 leaves a debt of 0.25, which
			// refills in 0.25/(8/h) = 112.5s.
			res := limitTx(t, l, name, key, txlimit.Count(8.25), txlimit.Reserve())
			require.True(t, Reserved(res))
			require.Equal(t, 112500*time.Millisecond, res.RetryAfter)
		}
	})

	t.Run("ValueIsSummedOverShards", func(t *testing.T) {
		name := UniqueName(t, "value")
		clk := NewClock()
		cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 60, Period: time.Minute, Capacity: 64, Shards: 16}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
		var snap txlimit.Result
		read := func() {
			inTx(t, func(tx TTx) {
				var err error
				snap, err = l.CheckTx(ctx, tx, name, "k", txlimit.Count(0))
				require.NoError(t, err)
			})
		}
		read()
		require.Equal(t, 64.0, snap.Remaining, "a limit never used is full")
		c, ok := l.Config(name)
		require.True(t, ok)
		require.Equal(t, 16, c.Shards)
		require.WithinDuration(t, clk.Now(), snap.At, 0)
		for range 10 {
			require.True(t, limitTx(t, l, name, "k", txlimit.Count(3)).OK)
		}
		read()
		require.InDelta(t, 34.0, snap.Remaining, 1e-9)
		// Each shard refills on its own up to its capacity (4), so 10s adds
		// up to 10 tokens: all 10 when the shards are balanced, fewer when
		// some were full and could not take their share.
		clk.Advance(10 * time.Second)
		read()
		require.Greater(t, snap.Remaining, 34.0)
		require.LessOrEqual(t, snap.Remaining, 44.0+1e-9)
		clk.Advance(time.Hour)
		read()
		require.InDelta(t, 64.0, snap.Remaining, 1e-9)
	})

	t.Run("ResetDeletesAllShards", func(t *testing.T) {
		name := UniqueName(t, "reset")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: 4}}, clk)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(4)).OK)
		require.True(t, limitTx(t, l, name, "other", txlimit.Count(4)).OK)
		require.Len(t, h.Rows(t, name, "k"), 4)
		inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(ctx, tx, name, "k")) })
		require.Empty(t, h.Rows(t, name, "k"))
		require.Len(t, h.Rows(t, name, "other"), 4)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(4)).OK)
	})

	t.Run("CheckWritesNothing", func(t *testing.T) {
		name := UniqueName(t, "check")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Second}}, clk)
		var res txlimit.Result
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.CheckTx(ctx, tx, name, "k", txlimit.Count(2))
			require.NoError(t, err)
		})
		require.True(t, res.OK)
		require.Empty(t, h.Rows(t, name, "k"))
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(2)).OK)
		before := h.Rows(t, name, "k")
		inTx(t, func(tx TTx) {
			var err error
			res, err = l.CheckTx(ctx, tx, name, "k")
			require.NoError(t, err)
		})
		require.False(t, res.OK)
		require.Equal(t, 500*time.Millisecond, res.RetryAfter)
		require.Equal(t, before, h.Rows(t, name, "k"))
	})

	t.Run("ClockSteppingBackAddsNothing", func(t *testing.T) {
		name := UniqueName(t, "backwards")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 5}}, clk)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(5)).OK)
		clk.Advance(-time.Hour)
		res := limitTx(t, l, name, "k")
		require.False(t, res.OK)
		require.Equal(t, time.Hour+time.Second, res.RetryAfter, "refill resumes when the clock is back at the stored time")
		clk.Advance(time.Hour + 2*time.Second)
		require.True(t, limitTx(t, l, name, "k", txlimit.Count(2)).OK)
		require.False(t, limitTx(t, l, name, "k").OK, "the hour the clock went back is not credited twice")
	})

	t.Run("DatabaseClockByDefault", func(t *testing.T) {
		name := UniqueName(t, "dbclock")
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}}, nil)
		res := limitTx(t, l, name, "k")
		require.True(t, res.OK)
		require.WithinDuration(t, time.Now(), res.At, time.Minute)
		res = limitTx(t, l, name, "k")
		require.False(t, res.OK)
		require.InDelta(t, float64(time.Hour), float64(res.RetryAfter), float64(time.Minute))
	})

	t.Run("BadInputIsAnErrorAndWritesNothing", func(t *testing.T) {
		name := UniqueName(t, "bad")
		cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute, MaxReserved: 5}
		l := newLimiter(t, map[string]txlimit.Config{name: cfg}, NewClock())
		cases := []struct {
			desc  string
			name  string
			key   string
			field string
			opts  []txlimit.Option
		}{
			{"unknown name", "no-such-limit", "k", "name", nil},
			{"empty name", "", "k", "name", nil},
			{"NUL in key", name, "a\x00b", "key", nil},
			{"invalid UTF-8 key", name, "\xff", "key", nil},
			{"negative count", name, "k", "Count", []txlimit.Option{txlimit.Count(-1)}},
			{"NaN count", name, "k", "Count", []txlimit.Option{txlimit.Count(math.NaN())}},
			{"Inf count", name, "k", "Count", []txlimit.Option{txlimit.Count(math.Inf(1))}},
			{"count above capacity", name, "k", "Count", []txlimit.Option{txlimit.Count(6)}},
			{"count above capacity+MaxReserved", name, "k", "Count", []txlimit.Option{txlimit.Count(10.5), txlimit.Reserve()}},
			{"zero rate", name, "k", "Rate", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Period: time.Second})}},
			{"NaN rate", name, "k", "Rate", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: math.NaN(), Period: time.Second})}},
			{"zero period", name, "k", "Period", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1})}},
			{"negative capacity", name, "k", "Capacity", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: -1})}},
			{"too many shards", name, "k", "Shards", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Shards: 1024 + 1})}},
			{"unknown kind", name, "k", "Kind", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: 9, Rate: 1, Period: time.Second})}},
			{"zone on a token bucket", name, "k", "Zone", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Zone: "UTC"})}},
			{"zone on a fixed window", name, "k", "Zone", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.FixedWindow, Rate: 1, Period: time.Hour, Zone: "Europe/Berlin"})}},
			{"week start on a sliding window", name, "k", "WeekStart", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.SlidingWindow, Rate: 1, Period: time.Hour, WeekStart: time.Monday})}},
			{"calendar with a period", name, "k", "Period", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Daily, Rate: 1, Period: time.Hour, Zone: "UTC"})}},
			{"kind past the last kind", name, "k", "Kind", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Concurrency + 1, Rate: 1, Zone: "UTC"})}},
			{"calendar without a zone", name, "k", "Zone", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Daily, Rate: 1})}},
			{"unknown zone", name, "k", "Zone", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Monthly, Rate: 1, Zone: "Mars/Olympus_Mons"})}},
			{"local zone", name, "k", "Zone", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Monthly, Rate: 1, Zone: "Local"})}},
			{"week start on a month", name, "k", "WeekStart", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.Monthly, Rate: 1, Zone: "UTC", WeekStart: time.Monday})}},
			{"report remaining unsharded", name, "k", "ReportRemaining", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, ReportRemaining: true})}},
			{"lease for without lease", name, "k", "LeaseFor", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, LeaseFor: time.Second})}},
			{"no kind", name, "k", "Kind", []txlimit.Option{txlimit.Inline(txlimit.Config{Rate: 1, Period: time.Second})}},
			{"start on a token bucket", name, "k", "Start", []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Start: T0})}},
		}
		for _, tc := range cases {
			t.Run(tc.desc, func(t *testing.T) {
				inTx(t, func(tx TTx) {
					_, err := l.LimitTx(ctx, tx, tc.name, tc.key, tc.opts...)
					var inv *txlimit.InvalidError
					require.ErrorAs(t, err, &inv)
					require.Equal(t, tc.field, inv.Field)
					require.Contains(t, err.Error(), tc.field)
					_, err = l.CheckTx(ctx, tx, tc.name, tc.key, tc.opts...)
					require.ErrorAs(t, err, new(*txlimit.InvalidError))
				})
				if utf8.ValidString(tc.key) && !strings.ContainsRune(tc.key, 0) {
					require.Empty(t, h.Rows(t, tc.name, tc.key))
				}
			})
		}
		_, err := l.Check(ctx, "no-such-limit", "k")
		RequireUnknownLimit(t, err)
		_, err = txlimit.New(h.Store, map[string]txlimit.Config{"x": {Kind: txlimit.FixedWindow, Rate: 1}}, nil)
		var inv *txlimit.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "x", inv.Limit)
		require.Equal(t, "Period", inv.Field)
		// A calendar kind says its zone, UTC included: the error names the
		// field and the fix.
		for _, kind := range []txlimit.Kind{txlimit.Daily, txlimit.Weekly, txlimit.Monthly, txlimit.Yearly} {
			_, err = txlimit.New(h.Store, map[string]txlimit.Config{"x": {Kind: kind, Rate: 1}}, nil)
			require.ErrorAs(t, err, &inv, KindName(kind))
			require.Equal(t, "x", inv.Limit)
			require.Equal(t, "Zone", inv.Field, KindName(kind))
			require.Contains(t, inv.Problem, `"UTC"`, KindName(kind))
			_, err = txlimit.New(h.Store, map[string]txlimit.Config{"x": {Kind: kind, Rate: 1, Zone: "UTC"}}, nil)
			require.NoError(t, err, KindName(kind))
		}
	})

	t.Run("CancelledContextLeavesStateAlone", func(t *testing.T) {
		name := UniqueName(t, "cancel")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour}}, clk)
		require.True(t, limitTx(t, l, name, "k").OK)
		before := h.Rows(t, name, "k")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		tx := h.Begin(t)
		_, err := l.LimitTx(cctx, tx, name, "k")
		require.ErrorIs(t, err, context.Canceled)
		h.Rollback(tx)
		require.Equal(t, before, h.Rows(t, name, "k"))
	})

	t.Run("ConcurrentCallsAdmitExactly", func(t *testing.T) {
		const workers, callsEach = 32, 3
		for _, tc := range []struct {
			kind   txlimit.Kind
			shards int
		}{
			{txlimit.TokenBucket, 1}, {txlimit.FixedWindow, 1},
			{txlimit.TokenBucket, 4}, {txlimit.FixedWindow, 8},
		} {
			t.Run(fmt.Sprintf("%v/shards=%d", KindName(tc.kind), tc.shards), func(t *testing.T) {
				name := UniqueName(t, "hot")
				clk := NewClock()
				const capacity = 40
				l := newLimiter(t, map[string]txlimit.Config{name: {
					Kind: tc.kind, Rate: capacity, Period: time.Hour, Shards: tc.shards,
				}}, clk)
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, workers*callsEach)
				sem := make(chan struct{}, h.Conns)
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range callsEach {
							func() {
								sem <- struct{}{}
								// Deferred: a failed begin ends this goroutine,
								// and its slot must not be lost with it.
								defer func() { <-sem }()
								tx := h.Begin(t)
								res, err := l.LimitTx(ctx, tx, name, "hot")
								if err != nil {
									h.Rollback(tx)
									errs <- err
									return
								}
								if err := h.Commit(tx); err != nil {
									errs <- err
								} else if res.OK {
									admitted.Add(1)
								} else {
									denied.Add(1)
								}
							}()
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				require.EqualValues(t, capacity, admitted.Load())
				require.EqualValues(t, workers*callsEach-capacity, denied.Load())
				var snap txlimit.Result
				inTx(t, func(tx TTx) {
					var err error
					snap, err = l.CheckTx(ctx, tx, name, "hot", txlimit.Count(0))
					require.NoError(t, err)
				})
				require.InDelta(t, 0, snap.Remaining, 1e-9)
			})
		}
	})

	t.Run("ConcurrentReservationsStackExactly", func(t *testing.T) {
		const workers = 24
		name := UniqueName(t, "stack")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {
			Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 4, MaxReserved: 10, Shards: 2,
		}}, clk)
		var mu sync.Mutex
		var retries []time.Duration
		var wg sync.WaitGroup
		sem := make(chan struct{}, h.Conns)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				tx := h.Begin(t)
				res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Reserve())
				if err != nil {
					h.Rollback(tx)
					t.Error(err)
					return
				}
				if err := h.Commit(tx); err != nil {
					t.Error(err)
					return
				}
				if res.OK {
					mu.Lock()
					retries = append(retries, res.RetryAfter)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		// 4 granted now, then 10 reserved at 1s, 2s, … 10s, then denials.
		require.Len(t, retries, 14)
		seen := map[time.Duration]int{}
		for _, r := range retries {
			seen[r]++
		}
		require.Equal(t, 4, seen[0])
		for i := 1; i <= 10; i++ {
			require.Equal(t, 1, seen[time.Duration(i)*time.Second], "one reservation at %ds", i)
		}
	})
}
