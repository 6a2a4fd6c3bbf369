package txlimit_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

func TestWaitPostgres(t *testing.T) {
	t.Parallel()
	runWait(t, pgstore.New(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 16)))
}

func TestWaitSQLite(t *testing.T) {
	t.Parallel()
	runWait(t, sqlitestore.New(testdb.OpenSQLite(t)))
}

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
	v := &virtualTime{now: storetest.T0, waiters: waiters}
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

func runWait[TTx any](t *testing.T, store driver.Store[TTx]) {
	ctx := context.Background()

	// Workers call Wait in a loop on one key of a token bucket of 5 tokens
	// refilled at 10 a second. Over the span [T0, end] the limit can grant
	// the 5 it holds plus one per 100ms: 5 + 20 by T0+2s. The last of those
	// arrives at T0+2s and is granted within the jitter's spread (100ms,
	// the time one token takes), so it is granted by end, just before the
	// 21st refill. Whatever the jitter draws, exactly 25 grants fall in the
	// span, and the i-th is never before its token.
	for _, workers := range []int{1, 8} {
		t.Run("WorkersGetExactlyTheRate/"+strconv.Itoa(workers), func(t *testing.T) {
			name := storetest.UniqueName(t, "wait")
			v := newVirtualTime(workers)
			l, err := txlimit.New(store, map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Second, Capacity: 5},
			}, &txlimit.Options{Clock: v.Now})
			require.NoError(t, err)
			const tokenTime = 100 * time.Millisecond
			end := storetest.T0.Add(2*time.Second + tokenTime - time.Microsecond)
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
						res, err := txlimit.WaitWithSleep(wctx, l, v.sleep, name, "k")
						if err != nil {
							if wctx.Err() == nil {
								t.Errorf("Wait: %v", err)
							}
							return
						}
						if !res.OK || storetest.Reserved(res) {
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
			require.Len(t, grants, 25, "grants: %v", grants)
			for i, at := range grants {
				earliest := storetest.T0.Add(time.Duration(max(0, i-4)) * tokenTime)
				require.False(t, at.Before(earliest), "grant %d at %v, before its token at %v", i, at, earliest)
				require.False(t, at.After(end))
			}
			t.Logf("%d workers: %d sleeps for 25 grants", workers, v.sleeps)
		})
	}

	t.Run("FrozenClockWaitsUntilTheContextEnds", func(t *testing.T) {
		name := storetest.UniqueName(t, "frozen")
		clk := storetest.NewClock()
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.FixedWindow, Rate: 2, Period: time.Minute, Start: storetest.T0.Add(-10 * time.Second)},
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
		res, err := txlimit.WaitWithSleep(wctx, l, func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			if len(slept) == 3 {
				cancel()
				return ctx.Err()
			}
			return nil
		}, name, "k")
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
		name := storetest.UniqueName(t, "glacial")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1e-300, Period: time.Second, Capacity: 1},
		}, &txlimit.Options{Clock: storetest.NewClock().Now})
		require.NoError(t, err)
		res, err := l.Wait(ctx, name, "k")
		require.NoError(t, err)
		require.True(t, res.OK)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var slept []time.Duration
		res, err = txlimit.WaitWithSleep(wctx, l, func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			cancel()
			return ctx.Err()
		}, name, "k")
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, storetest.MaxWait, res.RetryAfter)
		require.Len(t, slept, 1)
		require.GreaterOrEqual(t, slept[0], storetest.MaxWait)
		require.Less(t, slept[0], storetest.MaxWait+time.Second)
	})

	t.Run("DeadlineBeforeRetryAfterReturnsAtOnce", func(t *testing.T) {
		name := storetest.UniqueName(t, "deadline")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		}, &txlimit.Options{Clock: storetest.NewClock().Now})
		require.NoError(t, err)
		_, err = l.Limit(ctx, name, "k")
		require.NoError(t, err)
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := txlimit.WaitWithSleep(dctx, l, func(context.Context, time.Duration) error {
			t.Error("Wait slept although the tokens come after the deadline")
			return nil
		}, name, "k")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, txlimit.ErrRateLimited)
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, err, &rl)
		require.Equal(t, time.Hour, rl.RetryAfter)
		require.False(t, res.OK)
		require.Equal(t, time.Hour, res.RetryAfter)
		require.ErrorContains(t, err, "after the context's deadline")

		// The real Wait too: it returned before the deadline passed.
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
		name := storetest.UniqueName(t, "bad")
		l, err := txlimit.New(store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 3},
		}, nil)
		require.NoError(t, err)
		never := func(context.Context, time.Duration) error {
			t.Error("Wait slept on bad input")
			return nil
		}
		_, err = txlimit.WaitWithSleep(ctx, l, never, name, "k", txlimit.Count(4))
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
		require.ErrorContains(t, err, "could never be granted")
		_, err = txlimit.WaitWithSleep(ctx, l, never, name, "k", txlimit.Reserve())
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
		require.ErrorContains(t, err, "Reserve does not go with Wait")
		_, err = txlimit.WaitWithSleep(ctx, l, never, "nope", "k")
		storetest.RequireUnknownLimit(t, err)
	})

	// On the real clock with real sleeps: every Wait ends granted, and the
	// limit took exactly one token per grant. (How long it took is not
	// asserted: the machine is shared.)
	t.Run("RealClock", func(t *testing.T) {
		name := storetest.UniqueName(t, "real")
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
