package storetest

// Pauses on every store (Limiter.Pause): every call on a paused key is
// denied with RetryAfter the time left until the pause ends, whatever the
// tokens, and takes nothing; at that instant the limit decides as before.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/waitsleep"
)

func runPause[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	newLimiter := func(t *testing.T, limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
		t.Helper()
		opts := &txlimit.Options{}
		if clk != nil {
			opts.Clock = clk.Now
		}
		l, err := txlimit.New(h.Store, limits, opts)
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
	pause := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, until time.Time) {
		t.Helper()
		tx := h.Begin(t)
		require.NoError(t, l.PauseTx(ctx, tx, name, key, until))
		require.NoError(t, h.Commit(tx))
	}
	// requirePaused asserts that every form of call on (name, key) is
	// denied as paused with RetryAfter left, and writes nothing.
	requirePaused := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, left time.Duration) {
		t.Helper()
		before := h.Rows(t, name, key)
		for _, opts := range [][]txlimit.Option{nil, {txlimit.Count(2)}, {txlimit.Reserve(), txlimit.Count(3)}, {txlimit.UpTo(5)}} {
			res := limit(t, l, name, key, opts...)
			require.False(t, res.OK, "a call on a paused key with %d options was granted: %+v", len(opts), res)
			require.True(t, res.Paused, "%+v", res)
			require.Equal(t, left, res.RetryAfter)
			require.Zero(t, res.Taken)
			var rl *txlimit.RateLimitedError
			require.ErrorAs(t, res.Err(), &rl)
			require.True(t, rl.Paused)
			require.Equal(t, left, rl.RetryAfter)
		}
		res, err := l.Check(ctx, name, key)
		require.NoError(t, err)
		require.False(t, res.OK)
		require.True(t, res.Paused)
		require.Equal(t, left, res.RetryAfter)
		all, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: key})
		require.NoError(t, err)
		require.False(t, all.OK)
		require.Equal(t, left, all.RetryAfter)
		require.True(t, all.Results[0].Paused)
		committed, err := l.Commit(ctx, func(TTx) error { return nil }, txlimit.Request{Name: name, Key: key})
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, err, &rl) // a denial is the error of Commit
		require.True(t, rl.Paused)
		require.False(t, committed.OK)
		require.True(t, committed.Results[0].Paused, "%+v", committed.Results[0])
		require.Equal(t, left, committed.RetryAfter)
		require.Equal(t, before, h.Rows(t, name, key), "a denied call on a paused key wrote")
	}
	perConfig := func(t *testing.T, fn func(t *testing.T, cfg txlimit.Config)) {
		for _, cfg := range []txlimit.Config{
			{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
			{Kind: txlimit.FixedWindow, Rate: 10, Period: time.Minute},
			{Kind: txlimit.SlidingWindow, Rate: 10, Period: time.Minute},
			{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Shards: 4},
			{Kind: txlimit.Daily, Rate: 10, Zone: "Europe/Berlin"},
		} {
			t.Run(fmt.Sprintf("%s/Shards%d", KindName(cfg.Kind), max(cfg.Shards, 1)), func(t *testing.T) { fn(t, cfg) })
		}
	}

	t.Run("DeniesUntilTheInstantThenDecidesAsBefore", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			require.True(t, limit(t, l, name, "k", txlimit.Count(4)).OK)
			before, err := l.Check(ctx, name, "k", txlimit.Count(0))
			require.NoError(t, err)

			until := T0.Add(90 * time.Second)
			pause(t, l, name, "k", until)
			requirePaused(t, l, name, "k", 90*time.Second)
			clk.Advance(30 * time.Second)
			requirePaused(t, l, name, "k", 60*time.Second)
			clk.Advance(60*time.Second - time.Microsecond)
			requirePaused(t, l, name, "k", time.Microsecond)

			// At until the pause has ended: the limit decides on the
			// tokens it had, which the pause neither took nor held back.
			clk.Advance(time.Microsecond)
			check, err := l.Check(ctx, name, "k", txlimit.Count(0))
			require.NoError(t, err)
			require.True(t, check.OK)
			require.False(t, check.Paused)
			other := newLimiter(t, map[string]txlimit.Config{name: cfg}, NewClock())
			atT0, err := other.Check(ctx, name, "k", txlimit.Count(0))
			require.NoError(t, err)
			require.Equal(t, before.Remaining, atT0.Remaining, "the pause changed the tokens")
			res := limit(t, l, name, "k", txlimit.Count(2))
			require.True(t, res.OK, "%+v", res)
			require.False(t, res.Paused)
			require.Zero(t, res.RetryAfter)
			if !res.Partial {
				require.InDelta(t, check.Remaining-2, res.Remaining, 1e-9) // a sliding window's arithmetic rounds
			}
		})
	})

	t.Run("HoldsAcrossLimiters", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			first := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			second := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			require.True(t, limit(t, second, name, "k").OK)
			pause(t, first, name, "k", T0.Add(time.Hour))
			requirePaused(t, second, name, "k", time.Hour)
			// A key without rows is paused too (its rows are created
			// full), and another key of the limit is not.
			pause(t, first, name, "fresh", T0.Add(time.Minute))
			requirePaused(t, second, name, "fresh", time.Minute)
			require.True(t, limit(t, second, name, "other").OK)
			// Pausing again replaces the instant, earlier or later.
			pause(t, second, name, "k", T0.Add(2*time.Minute))
			requirePaused(t, first, name, "k", 2*time.Minute)
			pause(t, second, name, "k", T0.Add(3*time.Hour))
			requirePaused(t, first, name, "k", 3*time.Hour)
		})
	})

	t.Run("LiftsWithTheZeroTimeOrAPastInstant", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			pause(t, l, name, "k", T0.Add(time.Hour))
			requirePaused(t, l, name, "k", time.Hour)
			require.NoError(t, l.Pause(ctx, name, "k", time.Time{}))
			res := limit(t, l, name, "k")
			require.True(t, res.OK, "%+v", res)
			pause(t, l, name, "k", T0.Add(time.Hour))
			requirePaused(t, l, name, "k", time.Hour)
			require.NoError(t, l.Pause(ctx, name, "k", T0)) // not after the clock
			require.True(t, limit(t, l, name, "k").OK)
			// Lifting a key that has no rows creates none.
			require.NoError(t, l.Pause(ctx, name, "never", time.Time{}))
			require.Empty(t, h.Rows(t, name, "never"))
		})
	})

	t.Run("InTheCallersTransaction", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			// A rolled-back pause leaves nothing: no row of a new key, and
			// the rows of a used one as they were.
			tx := h.Begin(t)
			require.NoError(t, l.PauseTx(ctx, tx, name, "new", T0.Add(time.Hour)))
			h.Rollback(tx)
			require.Empty(t, h.Rows(t, name, "new"))
			require.True(t, limit(t, l, name, "used").OK)
			rows := h.Rows(t, name, "used")
			tx = h.Begin(t)
			require.NoError(t, l.PauseTx(ctx, tx, name, "used", T0.Add(time.Hour)))
			// The transaction sees its own pause.
			res, err := l.LimitTx(ctx, tx, name, "used")
			require.NoError(t, err)
			require.True(t, res.Paused)
			require.Equal(t, time.Hour, res.RetryAfter)
			h.Rollback(tx)
			require.Equal(t, rows, h.Rows(t, name, "used"))
			require.True(t, limit(t, l, name, "used").OK)
			require.True(t, limit(t, l, name, "new").OK)
		})
	})

	t.Run("LimitAllTakesNothingWhenOneIsPaused", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
			b: {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Shards: 4},
		}, clk)
		require.True(t, limit(t, l, a, "k").OK)
		rowsA := h.Rows(t, a, "k")
		pause(t, l, b, "k", T0.Add(45*time.Second))
		tx := h.Begin(t)
		res, err := l.LimitAllTx(ctx, tx, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"})
		require.NoError(t, err)
		require.NoError(t, h.Commit(tx))
		require.False(t, res.OK)
		require.Equal(t, 45*time.Second, res.RetryAfter)
		require.False(t, res.Results[0].Paused)
		require.True(t, res.Results[1].Paused)
		require.Equal(t, 45*time.Second, res.Results[1].RetryAfter)
		require.Equal(t, rowsA, h.Rows(t, a, "k"), "LimitAll took from a limit while another was paused")
		clk.Advance(45 * time.Second)
		res, err = l.LimitAll(ctx, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"})
		require.NoError(t, err)
		require.True(t, res.OK, "%+v", res)
	})

	t.Run("ReservationsDoNotQueueBehindAPause", func(t *testing.T) {
		name := UniqueName(t, "api")
		clk := NewClock()
		// 4 an hour: a reservation of 8 on a full limit waits an hour.
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour}}, clk)
		res := limit(t, l, name, "k", txlimit.Reserve(), txlimit.Count(8))
		require.True(t, res.OK)
		require.Equal(t, time.Hour, res.RetryAfter)
		pause(t, l, name, "k", T0.Add(15*time.Minute))
		requirePaused(t, l, name, "k", 15*time.Minute)
		// After the pause the debt is what 15 minutes repaid of it (3
		// tokens), and a reservation of one more waits an hour again.
		clk.Advance(15 * time.Minute)
		res = limit(t, l, name, "k", txlimit.Reserve())
		require.True(t, res.OK)
		require.Equal(t, time.Hour, res.RetryAfter)
	})

	t.Run("PruneKeepsAPauseUntilItEnds", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			// Full rows, which Prune deletes, but paused.
			pause(t, l, name, "k", T0.Add(time.Hour))
			require.NotEmpty(t, h.Rows(t, name, "k"))
			_, err := l.Prune(ctx, nil)
			require.NoError(t, err)
			require.NotEmpty(t, h.Rows(t, name, "k"), "Prune deleted a pause")
			requirePaused(t, l, name, "k", time.Hour)
			clk.Advance(time.Hour)
			_, err = l.Prune(ctx, nil)
			require.NoError(t, err)
			require.Empty(t, h.Rows(t, name, "k"), "Prune kept the rows of a pause that had ended")
			require.True(t, limit(t, l, name, "k").OK)
		})
	})

	t.Run("TheTakeAtCommitAfterThePauseEnds", func(t *testing.T) {
		perConfig(t, func(t *testing.T, cfg txlimit.Config) {
			name := UniqueName(t, "api")
			clk := NewClock()
			l := newLimiter(t, map[string]txlimit.Config{name: cfg}, clk)
			pause(t, l, name, "k", T0.Add(time.Minute))
			clk.Advance(time.Minute)
			// The take that rides the COMMIT (pgstore) leaves a row with a
			// pause, ended or not, to the Go path: the first call after the
			// pause ends may be denied with RetryAfter 0 (try again) while
			// that path clears it; the next is granted.
			req := txlimit.Request{Name: name, Key: "k"}
			res, err := l.Commit(ctx, func(TTx) error { return nil }, req)
			if !res.OK {
				require.ErrorIs(t, err, txlimit.ErrRateLimited)
				require.Zero(t, res.RetryAfter)
				require.False(t, res.Results[0].Paused)
				res, err = l.Commit(ctx, func(TTx) error { return nil }, req)
			}
			require.NoError(t, err)
			require.True(t, res.OK, "%+v", res)
			res, err = l.Commit(ctx, func(TTx) error { return nil }, req)
			require.NoError(t, err)
			require.True(t, res.OK, "%+v", res)
		})
	})

	t.Run("RacesConcurrentTakesExactly", func(t *testing.T) {
		// Takes on separate connections race a pause of their key: each
		// is granted (before the pause commits) or denied as paused
		// (after), never denied for tokens, never both; a worker that saw
		// the pause sees it on every later take; and the tokens left are
		// exactly the capacity less the grants.
		for _, shards := range []int{1, 4} {
			t.Run(fmt.Sprintf("Shards%d", shards), func(t *testing.T) {
				const workers, takes, capacity = 6, 5, 1000
				name := UniqueName(t, "api")
				clk := NewClock()
				l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: shards}}, clk)
				var mu sync.Mutex
				granted, denied := 0, 0
				var wg sync.WaitGroup
				sem := make(chan struct{}, h.Conns-1) // a connection for the pause
				paused, committed := make(chan struct{}), make(chan struct{})
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sawPause := false
						for i := range takes {
							switch {
							case w == 0 && i == 2:
								close(paused) // the pause starts while the others take
							case w == 0 && i == 3:
								<-committed // and this worker's last takes come after it
							}
							sem <- struct{}{}
							tx := h.Begin(t)
							res, err := l.LimitTx(ctx, tx, name, "k")
							if err == nil {
								err = h.Commit(tx)
							} else {
								h.Rollback(tx)
							}
							<-sem
							if err != nil {
								t.Error(err)
								return
							}
							mu.Lock()
							switch {
							case res.OK && !sawPause:
								granted++
							case !res.OK && res.Paused && res.RetryAfter == time.Hour:
								denied++
								sawPause = true
							default:
								t.Errorf("take %d of worker %d (after a pause: %v): %+v", i, w, sawPause, res)
							}
							mu.Unlock()
						}
					}()
				}
				<-paused
				tx := h.Begin(t)
				require.NoError(t, l.PauseTx(ctx, tx, name, "k", T0.Add(time.Hour)))
				require.NoError(t, h.Commit(tx))
				close(committed)
				wg.Wait()
				require.Equal(t, workers*takes, granted+denied)
				require.GreaterOrEqual(t, denied, 2, "worker 0's last two takes come after the pause")
				check, err := l.Check(ctx, name, "k", txlimit.Count(0))
				require.NoError(t, err)
				require.True(t, check.Paused)
				require.Equal(t, float64(capacity-granted), check.Remaining)
			})
		}
	})

	t.Run("WaitSleepsUntilThePauseEnds", func(t *testing.T) {
		name := UniqueName(t, "api")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}}, clk)
		pause(t, l, name, "k", T0.Add(time.Hour))
		// Wait sleeps on the suite's clock: at least the time left, and
		// within one period's jitter of it (Wait's spread).
		var slept []time.Duration
		res, err := l.Wait(waitsleep.With(ctx, func(_ context.Context, d time.Duration) error {
			slept = append(slept, d)
			clk.Advance(d)
			return nil
		}), name, "k")
		require.NoError(t, err)
		require.True(t, res.OK, "%+v", res)
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], time.Hour)
		require.LessOrEqual(t, slept[0], time.Hour+6*time.Second) // Count/Rate of a Period
		// A deadline before the pause ends returns at once, denied.
		pause(t, l, name, "k", clk.Now().Add(time.Hour))
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err = l.Wait(dctx, name, "k")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, txlimit.ErrRateLimited)
		require.True(t, res.Paused)
		require.Equal(t, time.Hour, res.RetryAfter)
	})

	t.Run("ResetLiftsIt", func(t *testing.T) {
		name := UniqueName(t, "api")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}}, clk)
		pause(t, l, name, "k", T0.Add(time.Hour))
		require.NoError(t, l.Reset(ctx, name, "k"))
		require.Empty(t, h.Rows(t, name, "k"))
		require.True(t, limit(t, l, name, "k").OK)
	})

	t.Run("OnTheStoresClock", func(t *testing.T) {
		name := UniqueName(t, "api")
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}}, nil)
		require.True(t, limit(t, l, name, "k").OK)
		start := time.Now()
		require.NoError(t, l.Pause(ctx, name, "k", start.Add(time.Hour)))
		res := limit(t, l, name, "k")
		require.False(t, res.OK)
		require.True(t, res.Paused)
		// The store's clock is the database server's, within a minute of
		// this process's on the test machine.
		require.InDelta(t, float64(time.Hour), float64(res.RetryAfter), float64(time.Minute), "%v", res.RetryAfter)
		require.NoError(t, l.Pause(ctx, name, "k", time.Time{}))
		require.True(t, limit(t, l, name, "k").OK)
	})

	t.Run("BadInputWritesNothing", func(t *testing.T) {
		name, slots := UniqueName(t, "api"), UniqueName(t, "slots")
		l := newLimiter(t, map[string]txlimit.Config{
			name:  {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
			slots: {Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute},
		}, NewClock())
		var invalid *txlimit.InvalidError
		err := l.Pause(ctx, name, "k", time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "until", invalid.Field)
		err = l.Pause(ctx, slots, "k", T0.Add(time.Hour))
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "name", invalid.Field)
		err = l.Pause(ctx, UniqueName(t, "unknown"), "k", T0.Add(time.Hour))
		require.ErrorAs(t, err, &invalid)
		require.Empty(t, h.Rows(t, name, "k"))
		require.False(t, errors.Is(err, txlimit.ErrRateLimited))
	})
}
