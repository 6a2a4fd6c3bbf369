package storetest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runEdges is the suite's topic for what happens around the core: keys at
// and past their bound, limits redeployed with another Shards, and the
// Observer on every operation.
func runEdges[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	clk := NewClock()
	opts := &txlimit.Options{Clock: clk.Now}

	t.Run("key and name length", func(t *testing.T) {
		l, err := txlimit.New(h.Store, nil, opts)
		require.NoError(t, err)
		cfg := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour})
		name := UniqueName(t, "long")
		longest := strings.Repeat("0123456789abcdef", MaxKeyLen/16)
		res, err := l.Limit(ctx, name, longest, cfg)
		require.NoError(t, err, "a key of MaxKeyLen bytes works on every store")
		require.True(t, res.OK)
		res, err = l.Limit(ctx, name, longest, cfg)
		require.NoError(t, err)
		require.False(t, res.OK, "and is one limit")

		_, err = l.Limit(ctx, name, longest+"x", cfg)
		var invalid *txlimit.InvalidError
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "key", invalid.Field)
		require.Contains(t, err.Error(), "SHA-256", "the error says what to do")
		require.Empty(t, h.Rows(t, name, longest+"x"), "nothing written")

		_, err = l.Limit(ctx, strings.Repeat("n", 256+1), "k", cfg)
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "name", invalid.Field)
	})

	t.Run("resharding keeps the total", func(t *testing.T) {
		for _, tc := range []struct {
			from, to int
			kind     txlimit.Kind
		}{{1, 4, txlimit.TokenBucket}, {4, 1, txlimit.TokenBucket}, {3, 5, txlimit.FixedWindow}, {8, 2, txlimit.FixedWindow}} {
			name := UniqueName(t, "reshard")
			cfg := func(shards int) txlimit.Option {
				return txlimit.Inline(txlimit.Config{Kind: tc.kind, Rate: 20, Period: time.Hour, Shards: shards, Start: roundHourStart(tc.kind)})
			}
			l, err := txlimit.New(h.Store, nil, opts)
			require.NoError(t, err)
			// Drain to 5 of 20 under the old Shards, at one instant.
			res, err := l.Limit(ctx, name, "k", cfg(tc.from), txlimit.Count(15))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Len(t, h.Rows(t, name, "k"), tc.from)

			snap, err := l.Check(ctx, name, "k", cfg(tc.to), txlimit.Count(0))
			require.NoError(t, err)
			require.InDelta(t, 5, snap.Remaining, 1e-9, "%d -> %d shards: Check reads the same total", tc.from, tc.to)
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(6))
			require.NoError(t, err)
			require.False(t, res.OK, "%d -> %d shards: no tokens appear", tc.from, tc.to)
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(5))
			require.NoError(t, err)
			require.True(t, res.OK, "%d -> %d shards: none disappear", tc.from, tc.to)
			require.InDelta(t, 0, res.Remaining, 1e-9)
			require.Len(t, h.Rows(t, name, "k"), tc.to)

			// And back, through LimitAll, in debt.
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(2), txlimit.Reserve())
			require.NoError(t, err)
			require.True(t, Reserved(res), "%d -> %d: %+v", tc.from, tc.to, res)
			m, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: "k", Options: []txlimit.Option{cfg(tc.from), txlimit.Count(0), txlimit.Reserve()}})
			require.NoError(t, err)
			require.True(t, m.OK)
			require.InDelta(t, -2, m.Results[0].Remaining, 1e-9, "the debt moves with the tokens")
			require.Len(t, h.Rows(t, name, "k"), tc.from)
		}
	})

	t.Run("sharded refill is not lost", func(t *testing.T) {
		// The reproduction: Rate 2/s, Capacity 4, Shards 2. On
		// PostgreSQL the take at T0+2s is served from one shard, which is
		// then stamped T0+2s while the other stays at T0; the take at
		// T0+1s (a clock that stepped back, or one read before the locks
		// were held) pools the shards. It must credit the shard that was
		// behind with its refill up to T0+2s, as the unsharded limit has
		// it, rather than project it to T0+1s and stamp it T0+2s.
		for _, kind := range []txlimit.Kind{txlimit.TokenBucket, txlimit.FixedWindow} {
			holds := map[int]float64{}
			for _, shards := range []int{1, 2} {
				name := UniqueName(t, "refill")
				c := NewClock()
				cfg := txlimit.Config{Kind: kind, Rate: 2, Period: time.Second, Capacity: 4, Shards: shards}
				if kind == txlimit.FixedWindow {
					// Windows of 1s, each adding 2: the same totals at
					// whole seconds.
					cfg.Start = T0
				}
				l, err := txlimit.New(h.Store, map[string]txlimit.Config{name: cfg}, &txlimit.Options{Clock: c.Now})
				require.NoError(t, err)
				res, err := l.Limit(ctx, name, "k", txlimit.Count(4))
				require.NoError(t, err)
				require.True(t, res.OK)
				c.Advance(2 * time.Second)
				res, err = l.Limit(ctx, name, "k", txlimit.Count(1))
				require.NoError(t, err)
				require.True(t, res.OK)
				c.Advance(-time.Second)
				res, err = l.Limit(ctx, name, "k", txlimit.Count(2))
				require.NoError(t, err)
				require.True(t, res.OK, "%v, %d shards: the limit holds 3 (as of T0+2s)", KindName(kind), shards)
				c.Advance(time.Second)
				snap, err := l.Check(ctx, name, "k", txlimit.Count(0))
				require.NoError(t, err)
				holds[shards] = snap.Remaining
				// And it admits exactly that.
				res, err = l.Limit(ctx, name, "k", txlimit.Count(1))
				require.NoError(t, err)
				require.True(t, res.OK, "%v, %d shards", KindName(kind), shards)
				res, err = l.Limit(ctx, name, "k", txlimit.Count(0.5))
				require.NoError(t, err)
				require.False(t, res.OK, "%v, %d shards", KindName(kind), shards)
			}
			require.InDelta(t, 1, holds[1], 1e-9, "%v: unsharded", KindName(kind))
			require.InDelta(t, holds[1], holds[2], 1e-9, "%v: the sharded limit holds what the unsharded one holds", KindName(kind))
		}
	})

	t.Run("waits beyond MaxWait", func(t *testing.T) {
		c := NewClock()
		l, err := txlimit.New(h.Store, nil, &txlimit.Options{Clock: c.Now})
		require.NoError(t, err)
		var invalid *txlimit.InvalidError

		// A reservation 3e6 hours (342 years) away cannot be represented:
		// refused as bad input by every form, nothing written.
		hourly := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour})
		name := UniqueName(t, "far")
		far := []txlimit.Option{hourly, txlimit.Count(3e6), txlimit.Reserve()}
		calls := map[string]func() error{
			"Limit": func() error { _, err := l.Limit(ctx, name, "k", far...); return err },
			"LimitTx": func() error {
				tx := h.Begin(t)
				defer h.Rollback(tx)
				_, err := l.LimitTx(ctx, tx, name, "k", far...)
				return err
			},
			"Check": func() error { _, err := l.Check(ctx, name, "k", far...); return err },
			"CheckTx": func() error {
				tx := h.Begin(t)
				defer h.Rollback(tx)
				_, err := l.CheckTx(ctx, tx, name, "k", far...)
				return err
			},
			"LimitAll": func() error {
				_, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: "other", Options: []txlimit.Option{hourly}}, txlimit.Request{Name: name, Key: "k", Options: far})
				return err
			},
		}
		for form, call := range calls {
			err := call()
			require.ErrorAs(t, err, &invalid, form)
			require.Equal(t, "Count", invalid.Field, form)
			require.Contains(t, err.Error(), "MaxReserved", "%s: the error names the fix", form)
			require.Empty(t, h.Rows(t, name, "k"), "%s: nothing written", form)
			require.Empty(t, h.Rows(t, name, "other"), "%s: nothing written for any limit of the call", form)
		}
		// With the limit in use, the refusal leaves its rows alone.
		res, err := l.Limit(ctx, name, "k", hourly, txlimit.Count(3), txlimit.Reserve())
		require.NoError(t, err)
		require.True(t, Reserved(res))
		require.Equal(t, 2*time.Hour, res.RetryAfter)
		before := h.Rows(t, name, "k")
		_, err = l.Limit(ctx, name, "k", far...)
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, before, h.Rows(t, name, "k"))
		// MaxReserved caps the debt: then the same count is a plain denial.
		capped := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, MaxReserved: 10})
		_, err = l.Limit(ctx, UniqueName(t, "capped"), "k", capped, txlimit.Count(3e6), txlimit.Reserve())
		require.ErrorAs(t, err, &invalid, "above Capacity+MaxReserved: still bad input")

		// Denials whose wait is beyond MaxWait say MaxWait, never less
		// and never negative: a rate of 1e-300, and a century-long period.
		for _, cfg := range []txlimit.Config{
			{Kind: txlimit.TokenBucket, Rate: 1e-300, Period: time.Second, Capacity: 1},
			{Kind: txlimit.TokenBucket, Rate: 1, Period: 100 * 365 * 24 * time.Hour, Capacity: 2},
			{Kind: txlimit.FixedWindow, Rate: 1, Period: 100 * 365 * 24 * time.Hour, Capacity: 2, Start: T0},
		} {
			name := UniqueName(t, "slow")
			opt := txlimit.Inline(cfg)
			count := txlimit.Count(cfg.Capacity)
			res, err := l.Limit(ctx, name, "k", opt, count)
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Positive(t, res.NextToken, "%+v", cfg)
			require.LessOrEqual(t, res.NextToken, MaxWait, "%+v", cfg)
			res, err = l.Limit(ctx, name, "k", opt, count)
			require.NoError(t, err)
			require.False(t, res.OK)
			require.Equal(t, MaxWait, res.RetryAfter, "%+v", cfg)
			require.True(t, res.At.Add(res.RetryAfter).After(res.At))
			if cfg.Rate < 1 {
				require.Equal(t, MaxWait, res.NextToken)
			}
			res, err = l.Check(ctx, name, "k", opt, count)
			require.NoError(t, err)
			require.Equal(t, MaxWait, res.RetryAfter)
			m, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: "k", Options: []txlimit.Option{opt, count}})
			require.NoError(t, err)
			require.False(t, m.OK)
			require.Equal(t, MaxWait, m.RetryAfter)
			require.Equal(t, MaxWait, m.Err().(*txlimit.RateLimitedError).RetryAfter)
			// Wait with a deadline gives up at once.
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			res, err = l.Wait(wctx, name, "k", opt, count)
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
			require.Equal(t, MaxWait, res.RetryAfter)
			// A reservation that needs more than MaxWait is refused.
			_, err = l.Limit(ctx, name, "k", opt, count, txlimit.Reserve())
			require.ErrorAs(t, err, &invalid, "%+v", cfg)
			require.Equal(t, "Count", invalid.Field)
		}
	})

	t.Run("state stays finite", func(t *testing.T) {
		c := NewClock()
		l, err := txlimit.New(h.Store, nil, &txlimit.Options{Clock: c.Now})
		require.NoError(t, err)
		var invalid *txlimit.InvalidError
		finite := func(t *testing.T, name string) {
			t.Helper()
			for _, row := range h.Rows(t, name, "k") {
				require.NotContains(t, strings.ToLower(row), "inf", row)
				require.NotContains(t, strings.ToLower(row), "nan", row)
			}
		}
		for _, shards := range []int{1, 3} {
			// A rate so high that a debt of 1e308 is repaid in 100 s: the
			// first reservation is representable, a second would take the
			// value to -Inf.
			opt := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1e300, Period: time.Microsecond, Capacity: 1, Shards: shards})
			name := UniqueName(t, "huge")
			res, err := l.Limit(ctx, name, "k", opt, txlimit.Count(1e308), txlimit.Reserve())
			require.NoError(t, err)
			require.True(t, Reserved(res), "%+v", res)
			require.Equal(t, 100*time.Second, res.RetryAfter)
			before := h.Rows(t, name, "k")
			_, err = l.Limit(ctx, name, "k", opt, txlimit.Count(1e308), txlimit.Reserve())
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, "Count", invalid.Field)
			require.Equal(t, before, h.Rows(t, name, "k"), "nothing written")
			finite(t, name)
			snap, err := l.Check(ctx, name, "k", opt, txlimit.Count(0))
			require.NoError(t, err)
			require.InDelta(t, -1e308, snap.Remaining, 1e293)

			// Credits cap at Capacity and stay finite.
			require.NoError(t, l.Credit(ctx, name, "k", 1e308, opt))
			require.NoError(t, l.Credit(ctx, name, "k", 1e308, opt))
			snap, err = l.Check(ctx, name, "k", opt, txlimit.Count(0))
			require.NoError(t, err)
			require.InDelta(t, 1, snap.Remaining, 1e-9)
			finite(t, name)
		}
		// With an hourly rate, the Count(1e308) is refused at once:
		// its wait is beyond MaxWait.
		name := UniqueName(t, "hourly")
		_, err = l.Limit(ctx, name, "k", txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}),
			txlimit.Count(1e308), txlimit.Reserve())
		require.ErrorAs(t, err, &invalid)
		require.Empty(t, h.Rows(t, name, "k"))
	})

	t.Run("observer sees every operation", func(t *testing.T) {
		var mu sync.Mutex
		var ops []string
		obs := ObserverFunc(func(_ context.Context, e txlimit.Event) {
			mu.Lock()
			defer mu.Unlock()
			outcome := e.Outcome
			if e.Op == "credit" || e.Op == "reset" || e.Op == "prune" {
				outcome = "ok"
				if e.Err != nil {
					outcome = "error"
				}
			}
			ops = append(ops, e.Op+":"+outcome)
		})
		name := UniqueName(t, "observed")
		l, err := txlimit.New(h.Store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		}, &txlimit.Options{Clock: clk.Now, Observer: obs})
		require.NoError(t, err)
		_, err = l.Limit(ctx, name, "k")
		require.NoError(t, err)
		_, err = l.Check(ctx, name, "k", txlimit.Count(0))
		require.NoError(t, err)
		require.NoError(t, l.Credit(ctx, name, "k", 1))
		require.NoError(t, l.Reset(ctx, name, "k"))
		_, err = l.Check(ctx, "no such limit", "k", txlimit.Count(0))
		RequireUnknownLimit(t, err)
		_, err = l.Prune(ctx, &txlimit.PruneOptions{MaxBatches: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"limit:allowed", "check:allowed", "credit:ok", "reset:ok", "check:error", "prune:ok"}, ops)
	})
}

// roundHourStart aligns fixed windows to a round hour so that a frozen
// clock sits in one window.
func roundHourStart(kind txlimit.Kind) time.Time {
	if kind == txlimit.FixedWindow {
		return T0.Add(-time.Hour)
	}
	return time.Time{}
}
