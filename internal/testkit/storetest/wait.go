package storetest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/waitsleep"
)

// virtualTime is a clock for the limiter and a sleep for Wait that together
// run the waiters as a discrete-event simulation: the clock stands still
// while any waiter is busy (in a Limit call, on the real database), and when
// every waiter sleeps it jumps to the earliest wake-up. The outcome depends
// on the jitter drawn, never on how fast the machine is.
type virtualTime struct {
	mu      sync.Mutex
	cond    *sync.Cond
	now     time.Time
	waiters int // goroutines that have not finished
	asleep  []*sleeper
	sleeps  int
}

type sleeper struct {
	until time.Time
	wake  chan struct{}
}

func newVirtualTime(waiters int) *virtualTime {
	v := &virtualTime{now: T0, waiters: waiters}
	v.cond = sync.NewCond(&v.mu)
	return v
}

func (v *virtualTime) Now() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now
}

func (v *virtualTime) sleep(ctx context.Context, d time.Duration) error {
	v.mu.Lock()
	s := &sleeper{until: v.now.Add(d), wake: make(chan struct{})}
	v.asleep = append(v.asleep, s)
	v.sleeps++
	v.cond.Broadcast()
	v.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// step waits until every waiter sleeps, then moves the clock to the earliest
// wake-up and wakes the sleepers due then. It reports false, moving nothing,
// when that wake-up is after end.
func (v *virtualTime) step(end time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for len(v.asleep) < v.waiters {
		v.cond.Wait()
	}
	next := v.asleep[0].until
	for _, s := range v.asleep {
		if s.until.Before(next) {
			next = s.until
		}
	}
	if next.After(end) {
		return false
	}
	v.now = next
	v.asleep = slices.DeleteFunc(v.asleep, func(s *sleeper) bool {
		if s.until.After(next) {
			return false
		}
		close(s.wake)
		return true
	})
	return true
}

// runWait is Limiter.Wait on the store: on a virtual clock (the context
// carries Wait's sleep, waitsleep.With), workers get exactly the limit's
// rate whatever the jitter draws; a frozen clock waits until the context
// ends; a wait beyond MaxWait, a deadline before the tokens and bad input
// return at once; and on the real clock every Wait ends granted.
func runWait[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	store := h.Store

	// Workers call Wait in a loop on one key of a token bucket of 5 tokens
	// refilled at 10 a second. Over the span [T0, end] the limit can grant
	// the 5 it holds plus one per 100ms: 5 + 10 by T0+1s. The last of those
	// arrives at T0+1s and is granted within the jitter's spread (100ms,
	// the time one token takes), so it is granted by end, just before the
	// 11th refill. Whatever the jitter draws, exactly 15 grants fall in the
	// span, and the i-th is never before its token.
	for _, workers := range []int{1, 8} {
		t.Run("WorkersGetExactlyTheRate/"+strconv.Itoa(workers), func(t *testing.T) {
			name := UniqueName(t, "wait")
			v := newVirtualTime(workers)
			l, err := txlimit.New(store, map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Second, Capacity: 5},
			}, &txlimit.Options{Clock: v.Now})
			require.NoError(t, err)
			const tokenTime = 100 * time.Millisecond
			end := T0.Add(time.Second + tokenTime - time.Microsecond)
			wctx, cancel := context.WithCancel(ctx)
			var (
				mu     sync.Mutex
				grants []time.Time
				wg     sync.WaitGroup
			)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						res, err := l.Wait(waitsleep.With(wctx, v.sleep), name, "k")
						if err != nil {
							if wctx.Err() == nil {
								t.Errorf("Wait: %v", err)
							}
							return
						}
						if !res.OK || Reserved(res) {
							t.Errorf("Wait returned %+v, not a plain grant", res)
						}
						mu.Lock()
						grants = append(grants, res.At)
						mu.Unlock()
					}
				}()
			}
			for v.step(end) {
			}
			cancel()
			wg.Wait()
			slices.SortFunc(grants, time.Time.Compare)
			require.Len(t, grants, 15, "grants: %v", grants)
			for i, at := range grants {
				earliest := T0.Add(time.Duration(max(0, i-4)) * tokenTime)
				require.False(t, at.Before(earliest), "grant %d at %v, before its token at %v", i, at, earliest)
				require.False(t, at.After(end))
			}
			t.Logf("%d workers: %d sleeps for 15 grants", workers, v.sleeps)
		})
	}

	t.Run("FrozenClockWaitsUntilTheContextEnds", func(t *testing.T) {
		name := UniqueName(t, "frozen")
		clk := NewClock()
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.FixedWindow, Rate: 2, Period: time.Minute, Start: T0.Add(-10 * time.Second)},
		}, &txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		for range 2 {
			res, err := l.Wait(ctx, name, "k")
			require.NoError(t, err)
			require.True(t, res.OK)
		}
		// The window ends in 50s, and the clock never gets there: every
		// attempt is denied, and Wait sleeps again until ctx ends.
		wctx, cancel := context.WithCancel(ctx)
		var slept []time.Duration
		res, err := l.Wait(waitsleep.With(wctx, func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			if len(slept) == 3 {
				cancel()
				return ctx.Err()
			}
			return nil
		}), name, "k")
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, res.OK)
		require.Equal(t, 50*time.Second, res.RetryAfter)
		for _, d := range slept {
			// The spread of a count of 1 is Period/Rate = 30s.
			require.GreaterOrEqual(t, d, 50*time.Second)
			require.Less(t, d, 80*time.Second)
		}
		snap, err := l.Check(ctx, name, "k", txlimit.Count(0))
		require.NoError(t, err)
		require.Equal(t, 0.0, snap.Remaining, "the denied attempts took nothing")
		clk.Advance(50 * time.Second)
		res, err = l.Wait(ctx, name, "k", txlimit.Count(2))
		require.NoError(t, err)
		require.True(t, res.OK, "WaitN: the next window grants both tokens at once")
	})

	t.Run("WaitBeyondMaxWaitSleepsMaxWait", func(t *testing.T) {
		// A wait no Duration holds: Wait sleeps MaxWait (plus a jitter of
		// at most Period), never a negative or wrapped-around duration.
		name := UniqueName(t, "glacial")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1e-300, Period: time.Second, Capacity: 1},
		}, &txlimit.Options{Clock: NewClock().Now})
		require.NoError(t, err)
		res, err := l.Wait(ctx, name, "k")
		require.NoError(t, err)
		require.True(t, res.OK)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var slept []time.Duration
		res, err = l.Wait(waitsleep.With(wctx, func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			cancel()
			return ctx.Err()
		}), name, "k")
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, MaxWait, res.RetryAfter)
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], MaxWait)
		require.Less(t, slept[0], MaxWait+time.Second)
	})

	t.Run("DeadlineBeforeRetryAfterReturnsAtOnce", func(t *testing.T) {
		name := UniqueName(t, "deadline")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		}, &txlimit.Options{Clock: NewClock().Now})
		require.NoError(t, err)
		_, err = l.Limit(ctx, name, "k")
		require.NoError(t, err)
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := l.Wait(waitsleep.With(dctx, func(context.Context, time.Duration) error {
			t.Error("Wait slept although the tokens come after the deadline")
			return nil
		}), name, "k")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, txlimit.ErrRateLimited)
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, err, &rl)
		require.Equal(t, time.Hour, rl.RetryAfter)
		require.False(t, res.OK)
		require.Equal(t, time.Hour, res.RetryAfter)
		require.ErrorContains(t, err, "after the context's deadline")

		// Without a sleep of the test's own too: it returned before the deadline passed.
		_, err = l.Wait(dctx, name, "k")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, dctx.Err(), "Wait returned at once, not at the deadline")

		// An ended context: no attempt at all.
		cctx, cancel2 := context.WithCancel(ctx)
		cancel2()
		_, err = l.Wait(cctx, name, "other")
		require.ErrorIs(t, err, context.Canceled)
		snap, err := l.Check(ctx, name, "other", txlimit.Count(0))
		require.NoError(t, err)
		require.Equal(t, 1.0, snap.Remaining)
	})

	t.Run("BadInputIsAnErrorAtOnce", func(t *testing.T) {
		name := UniqueName(t, "bad")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 3},
		}, nil)
		require.NoError(t, err)
		never := waitsleep.With(ctx, func(context.Context, time.Duration) error {
			t.Error("Wait slept on bad input")
			return nil
		})
		_, err = l.Wait(never, name, "k", txlimit.Count(4))
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
		require.ErrorContains(t, err, "could never be granted")
		_, err = l.Wait(never, name, "k", txlimit.Reserve())
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
		require.ErrorContains(t, err, "Reserve does not go with Wait")
		_, err = l.Wait(never, "nope", "k")
		RequireUnknownLimit(t, err)
	})

	// On the real clock with real sleeps: every Wait ends granted, and the
	// limit took exactly one token per grant. (How long it took is not
	// asserted: the machine is shared.)
	t.Run("RealClock", func(t *testing.T) {
		name := UniqueName(t, "real")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 50, Period: time.Second, Capacity: 2},
		}, &txlimit.Options{Clock: time.Now})
		require.NoError(t, err)
		var granted atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 3 {
					res, err := l.Wait(ctx, name, "k")
					if err != nil || !res.OK {
						t.Errorf("Wait: %+v, %v", res, err)
						return
					}
					granted.Add(1)
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, 12, granted.Load())
	})
}
