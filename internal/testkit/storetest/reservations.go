package storetest

// Reservations on every store: how stacked reservations are spaced, how
// MaxReserved bounds them, and how rollback and CreditTx give their tokens
// back. The expected RetryAfter of every step is computed here from the
// formulas of DESIGN.md, not copied from a run. The limits use rates and
// periods whose arithmetic is exact in binary (quarters of a token, whole
// microseconds), so every comparison is exact.

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// tokenBucketDebtWait is DESIGN.md's token-bucket RetryAfter for a limit
// debt tokens below zero: -value / (Rate/Period), rounded up to the
// microsecond.
func tokenBucketDebtWait(debt, rate float64, period time.Duration) time.Duration {
	return time.Duration(math.Ceil(debt*float64(period.Microseconds())/rate)) * time.Microsecond
}

// fixedWindowDebtWait is DESIGN.md's fixed-window RetryAfter for a limit
// debt tokens below zero in the window that began at windowStart:
// ts + Period*ceil(-value/Rate) - now.
func fixedWindowDebtWait(windowStart, now time.Time, debt, rate float64, period time.Duration) time.Duration {
	return windowStart.Add(period * time.Duration(math.Ceil(debt/rate))).Sub(now)
}

func runReservations[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	newLimiter := func(t *testing.T, name string, cfg txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
		t.Helper()
		l, err := txlimit.New(h.Store, map[string]txlimit.Config{name: cfg}, &txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		return l
	}
	// limit runs LimitTx in a transaction of its own and commits it.
	limit := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		tx := h.Begin(t)
		res, err := l.LimitTx(ctx, tx, name, key, opts...)
		require.NoError(t, err)
		require.NoError(t, h.Commit(tx))
		return res
	}
	// reserve runs a committed reservation of count that must be granted,
	// and returns its RetryAfter.
	reserve := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, count float64) time.Duration {
		t.Helper()
		res := limit(t, l, name, key, txlimit.Reserve(), txlimit.Count(count))
		require.True(t, res.OK, "reservation of %v refused: %+v", count, res)
		require.NoError(t, res.Err(), "a reservation is never an error")
		return res.RetryAfter
	}
	credit := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, count float64) {
		t.Helper()
		tx := h.Begin(t)
		require.NoError(t, l.CreditTx(ctx, tx, name, key, count))
		require.NoError(t, h.Commit(tx))
	}
	value := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string) float64 {
		t.Helper()
		res, err := l.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return res.Remaining
	}
	perShards := func(t *testing.T, fn func(t *testing.T, shards int)) {
		for _, shards := range []int{1, 4} {
			t.Run(fmt.Sprintf("Shards%d", shards), func(t *testing.T) { fn(t, shards) })
		}
	}

	// 4 tokens per hour: one token every 15 minutes.
	const tbRate, tbPeriod = 4.0, time.Hour
	tokenBucket := func(shards int) txlimit.Config {
		return txlimit.Config{Kind: txlimit.TokenBucket, Rate: tbRate, Period: tbPeriod, Shards: shards}
	}
	tbWait := func(debt float64) time.Duration { return tokenBucketDebtWait(debt, tbRate, tbPeriod) }

	// 2 tokens per minute, windows starting at 15 s before T0 and every
	// minute from there.
	const fwRate, fwPeriod = 2.0, time.Minute
	fwStart := T0.Add(-15 * time.Second)
	fixedWindow := func(shards int) txlimit.Config {
		return txlimit.Config{Kind: txlimit.FixedWindow, Rate: fwRate, Period: fwPeriod, Start: fwStart, Shards: shards}
	}

	t.Run("StackedTokenBucket", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			name := UniqueName(t, "stack-tb")
			clk := NewClock()
			l := newLimiter(t, name, tokenBucket(shards), clk)
			res := limit(t, l, name, "k", txlimit.Count(tbRate))
			require.True(t, res.OK)
			require.Zero(t, res.RetryAfter, "an ordinary grant is not a reservation")
			require.False(t, Reserved(res))

			// Each reservation waits one token longer than the one before.
			var prev time.Duration
			for debt := 1.0; debt <= 5; debt++ {
				got := reserve(t, l, name, "k", 1)
				require.Equal(t, tbWait(debt), got, "debt %v", debt)
				require.Greater(t, got, prev)
				prev = got
			}
			require.Equal(t, tbWait(7), reserve(t, l, name, "k", 2))
			require.Equal(t, -7.0, value(t, l, name, "k"))

			// Half a token refills in 450 s; the next reservation is due
			// when the remaining 6.5 + 1 tokens have refilled.
			clk.Advance(450 * time.Second)
			require.Equal(t, tbWait(7.5), reserve(t, l, name, "k", 1))
			require.Equal(t, -7.5, value(t, l, name, "k"))

			// CheckTx with Reserve predicts the next reservation and
			// writes nothing.
			before := h.Rows(t, name, "k")
			tx := h.Begin(t)
			chk, err := l.CheckTx(ctx, tx, name, "k", txlimit.Reserve())
			require.NoError(t, err)
			require.NoError(t, h.Commit(tx))
			require.True(t, Reserved(chk))
			require.Equal(t, tbWait(8.5), chk.RetryAfter)
			require.Equal(t, before, h.Rows(t, name, "k"))
			require.Equal(t, tbWait(8.5), reserve(t, l, name, "k", 1))
		})
	})

	t.Run("StackedFixedWindow", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			name := UniqueName(t, "stack-fw")
			clk := NewClock()
			l := newLimiter(t, name, fixedWindow(shards), clk)
			require.True(t, limit(t, l, name, "k", txlimit.Count(fwRate)).OK)

			// The window that contains T0 began at fwStart. Reservations
			// are due at the start of the first window whose tokens cover
			// them: two per window.
			var got []time.Duration
			for debt := 1.0; debt <= 4; debt++ {
				want := fixedWindowDebtWait(fwStart, clk.Now(), debt, fwRate, fwPeriod)
				wait := reserve(t, l, name, "k", 1)
				require.Equal(t, want, wait, "debt %v", debt)
				got = append(got, wait)
			}
			// The same, spelled out: the window after the current one
			// starts in 45 s, the one after that in 105 s.
			require.Equal(t, []time.Duration{45 * time.Second, 45 * time.Second, 105 * time.Second, 105 * time.Second}, got)

			// The next window (at T0+45s) adds Rate: debt 4 → 2. A
			// reservation now makes it 3, due in two windows.
			clk.Advance(45 * time.Second)
			windowStart := T0.Add(45 * time.Second)
			next := reserve(t, l, name, "k", 1)
			require.Equal(t, fixedWindowDebtWait(windowStart, clk.Now(), 3, fwRate, fwPeriod), next)
			require.Equal(t, 120*time.Second, next)

			// Mid-window nothing refills; the due time stays on the window
			// grid, so the wait shrinks by the time elapsed.
			clk.Advance(10 * time.Second)
			next = reserve(t, l, name, "k", 1)
			require.Equal(t, fixedWindowDebtWait(windowStart, clk.Now(), 4, fwRate, fwPeriod), next)
			require.Equal(t, 110*time.Second, next)
			require.Equal(t, -4.0, value(t, l, name, "k"))
		})
	})

	t.Run("MaxReservedRefusesAndWritesNothing", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			name := UniqueName(t, "cap")
			clk := NewClock()
			cfg := tokenBucket(shards)
			cfg.MaxReserved = 2
			l := newLimiter(t, name, cfg, clk)
			require.True(t, limit(t, l, name, "k", txlimit.Count(tbRate)).OK)
			require.Equal(t, tbWait(1), reserve(t, l, name, "k", 1))
			require.Equal(t, tbWait(2), reserve(t, l, name, "k", 1))
			before := h.Rows(t, name, "k")
			require.Len(t, before, shards)

			// A third token would put the limit 3 deep: refused, with the
			// time until it fits within the cap (one token refilled).
			res := limit(t, l, name, "k", txlimit.Reserve())
			require.False(t, res.OK)
			require.Equal(t, tbWait(1), res.RetryAfter)
			require.ErrorIs(t, res.Err(), txlimit.ErrRateLimited)
			require.Equal(t, before, h.Rows(t, name, "k"), "a refused reservation writes nothing")

			res = limit(t, l, name, "k", txlimit.Reserve(), txlimit.Count(3))
			require.False(t, res.OK)
			require.Equal(t, tbWait(3), res.RetryAfter)
			require.Equal(t, before, h.Rows(t, name, "k"))

			// More than Capacity+MaxReserved can never be reserved: bad
			// input, not a denial.
			tx := h.Begin(t)
			_, err := l.LimitTx(ctx, tx, name, "k", txlimit.Reserve(), txlimit.Count(tbRate+3))
			require.ErrorAs(t, err, new(*txlimit.InvalidError))
			require.ErrorContains(t, err, "MaxReserved")
			h.Rollback(tx)
			require.Equal(t, before, h.Rows(t, name, "k"))

			// Once a token has refilled, the reservation fits again.
			clk.Advance(tbWait(1))
			require.Equal(t, tbWait(2), reserve(t, l, name, "k", 1))
		})
	})

	t.Run("RolledBackReservationFreesTokens", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			name := UniqueName(t, "rollback")
			clk := NewClock()
			l := newLimiter(t, name, tokenBucket(shards), clk)
			require.True(t, limit(t, l, name, "k", txlimit.Count(tbRate)).OK)
			require.Equal(t, tbWait(1), reserve(t, l, name, "k", 1))
			before := h.Rows(t, name, "k")

			tx := h.Begin(t)
			res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Reserve(), txlimit.Count(3))
			require.NoError(t, err)
			require.True(t, Reserved(res))
			require.Equal(t, tbWait(4), res.RetryAfter)
			h.Rollback(tx)
			require.Equal(t, before, h.Rows(t, name, "k"))

			// The next reservation is spaced as if the rolled-back one had
			// never been made.
			require.Equal(t, tbWait(2), reserve(t, l, name, "k", 1))
		})
	})

	t.Run("CreditNeverAboveCapacity", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			name := UniqueName(t, "credit-cap")
			clk := NewClock()
			l := newLimiter(t, name, tokenBucket(shards), clk)

			// A key never used is full; a credit keeps it full.
			credit(t, l, name, "fresh", 10)
			require.Equal(t, tbRate, value(t, l, name, "fresh"))

			// Below capacity a credit adds exactly.
			require.True(t, limit(t, l, name, "k", txlimit.Count(3)).OK)
			credit(t, l, name, "k", 2)
			require.Equal(t, 3.0, value(t, l, name, "k"))

			// From debt, a large credit stops at Capacity...
			require.True(t, limit(t, l, name, "k", txlimit.Count(3)).OK)
			require.Equal(t, tbWait(2), reserve(t, l, name, "k", 2))
			credit(t, l, name, "k", 100)
			require.Equal(t, tbRate, value(t, l, name, "k"))
			// ...and what it granted is exactly one Capacity.
			require.True(t, limit(t, l, name, "k", txlimit.Count(tbRate)).OK)
			res := limit(t, l, name, "k")
			require.False(t, res.OK)
			require.Equal(t, tbWait(1), res.RetryAfter)
		})
	})

	t.Run("CreditRestoresRetryAfter", func(t *testing.T) {
		perShards(t, func(t *testing.T, shards int) {
			t.Run("TokenBucket", func(t *testing.T) {
				name := UniqueName(t, "credit-tb")
				clk := NewClock()
				l := newLimiter(t, name, tokenBucket(shards), clk)
				require.True(t, limit(t, l, name, "k", txlimit.Count(tbRate)).OK)
				require.Equal(t, tbWait(1), reserve(t, l, name, "k", 1))
				require.Equal(t, tbWait(2), reserve(t, l, name, "k", 1))
				// The second job is cancelled and its token given back:
				// the next reservation takes its slot.
				credit(t, l, name, "k", 1)
				require.Equal(t, tbWait(2), reserve(t, l, name, "k", 1))

				// A reservation and its credit in one transaction leave
				// the limit where it was.
				tx := h.Begin(t)
				res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Reserve(), txlimit.Count(2))
				require.NoError(t, err)
				require.Equal(t, tbWait(4), res.RetryAfter)
				require.NoError(t, l.CreditTx(ctx, tx, name, "k", 2))
				require.NoError(t, h.Commit(tx))
				require.Equal(t, -2.0, value(t, l, name, "k"))
				require.Equal(t, tbWait(3), reserve(t, l, name, "k", 1))
			})
			t.Run("FixedWindow", func(t *testing.T) {
				name := UniqueName(t, "credit-fw")
				clk := NewClock()
				l := newLimiter(t, name, fixedWindow(shards), clk)
				require.True(t, limit(t, l, name, "k", txlimit.Count(fwRate)).OK)
				wait := func(debt float64) time.Duration {
					return fixedWindowDebtWait(fwStart, clk.Now(), debt, fwRate, fwPeriod)
				}
				require.Equal(t, wait(1), reserve(t, l, name, "k", 1))
				require.Equal(t, wait(2), reserve(t, l, name, "k", 1))
				require.Equal(t, wait(3), reserve(t, l, name, "k", 1))
				require.Greater(t, wait(3), wait(2), "the third reservation falls in the next window")
				credit(t, l, name, "k", 1)
				require.Equal(t, wait(3), reserve(t, l, name, "k", 1))
				require.Equal(t, -3.0, value(t, l, name, "k"))
			})
		})
	})
}
