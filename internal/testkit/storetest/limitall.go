package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runLimitAll is the suite's topic for LimitAll: all or nothing over
// several limits, in any order, with reservations, under concurrency.
func runLimitAll[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	newLimiter := func(t *testing.T, limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
		t.Helper()
		l, err := txlimit.New(h.Store, limits, &txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		return l
	}
	// limitAll runs LimitAllTx in a transaction of the harness and commits.
	limitAll := func(t *testing.T, l *txlimit.Limiter[TTx], reqs ...txlimit.Request) txlimit.MultiResult {
		t.Helper()
		tx := h.Begin(t)
		res, err := l.LimitAllTx(ctx, tx, reqs...)
		require.NoError(t, err)
		require.NoError(t, h.Commit(tx))
		return res
	}
	value := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string) float64 {
		t.Helper()
		tx := h.Begin(t)
		defer h.Rollback(tx)
		res, err := l.CheckTx(ctx, tx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return res.Remaining
	}

	t.Run("GrantsAllAndReportsEach", func(t *testing.T) {
		a, b, c := UniqueName(t, "a"), UniqueName(t, "b"), UniqueName(t, "c")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
			b: {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Shards: 4},
			c: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 2},
		}, clk)
		res := limitAll(t, l, txlimit.Request{Name: c, Key: "k"}, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(3)}}, txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}})
		require.True(t, res.OK)
		require.NoError(t, res.Err())
		require.Zero(t, res.RetryAfter)
		require.Empty(t, Denied(res))
		require.WithinDuration(t, clk.Now(), res.At, 0)
		// One result per request, in request order.
		require.Len(t, res.Results, 3)
		for i, want := range []struct {
			name      string
			remaining float64
		}{{c, 1}, {a, 7}, {b, 3}} {
			require.Equal(t, want.name, res.Results[i].Name)
			require.Equal(t, "k", res.Results[i].Key)
			require.True(t, res.Results[i].OK)
			require.InDelta(t, want.remaining, res.Results[i].Remaining, 1e-9)
		}
		require.InDelta(t, 7, value(t, l, a, "k"), 1e-9)
		require.InDelta(t, 3, value(t, l, b, "k"), 1e-9)
		require.InDelta(t, 1, value(t, l, c, "k"), 1e-9)
		require.Len(t, h.Rows(t, b, "k"), 4, "every shard of a sharded limit is created")
	})

	t.Run("DenialInLastLimitLeavesTheOthersUntouched", func(t *testing.T) {
		for _, fresh := range []bool{false, true} {
			t.Run(fmt.Sprintf("fresh=%v", fresh), func(t *testing.T) {
				a, b, c := UniqueName(t, "a"), UniqueName(t, "b"), UniqueName(t, "c")
				clk := NewClock()
				l := newLimiter(t, map[string]txlimit.Config{
					a: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
					b: {Kind: txlimit.FixedWindow, Rate: 6, Period: time.Hour, Shards: 3, Start: T0},
					c: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Second},
				}, clk)
				if !fresh {
					require.True(t, limitAll(t, l, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"}).OK)
				}
				require.True(t, limitAll(t, l, txlimit.Request{Name: c, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}).OK)
				beforeA, beforeB, beforeC := h.Rows(t, a, "k"), h.Rows(t, b, "k"), h.Rows(t, c, "k")
				require.Equal(t, fresh, len(beforeA) == 0)

				clk.Advance(100 * time.Millisecond) // c holds 0.2
				res := limitAll(t, l, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(5)}}, txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}, txlimit.Request{Name: c, Key: "k"})
				require.False(t, res.OK)
				require.Equal(t, 400*time.Millisecond, res.RetryAfter, "c lacks 0.8 tokens at 2/s")
				require.Len(t, Denied(res), 1)
				require.Equal(t, c, Denied(res)[0].Name)
				require.True(t, res.Results[0].OK, "a alone would grant")
				require.True(t, res.Results[1].OK, "b alone would grant")
				// Nothing was taken: each Remaining is what the limit holds.
				wantA := 10.0
				if !fresh {
					wantA = 9 + 10.0/600 // 1 taken, 0.1s of refill at 10/min
				}
				require.InDelta(t, wantA, res.Results[0].Remaining, 1e-9)
				require.InDelta(t, 0.2, res.Results[2].Remaining, 1e-9)

				var rl *txlimit.RateLimitedError
				require.ErrorAs(t, res.Err(), &rl)
				require.Equal(t, c, rl.Name)
				require.Equal(t, 400*time.Millisecond, rl.RetryAfter)

				require.Equal(t, beforeA, h.Rows(t, a, "k"))
				require.Equal(t, beforeB, h.Rows(t, b, "k"))
				require.Equal(t, beforeC, h.Rows(t, c, "k"))
			})
		}
	})

	t.Run("RetryAfterIsTheLongestDenial", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
			b: {Kind: txlimit.TokenBucket, Rate: 1, Period: 3 * time.Second},
		}, clk)
		require.True(t, limitAll(t, l, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"}).OK)
		res := limitAll(t, l, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"})
		require.False(t, res.OK)
		require.Len(t, Denied(res), 2)
		require.Equal(t, time.Second, res.Results[0].RetryAfter)
		require.Equal(t, 3*time.Second, res.Results[1].RetryAfter)
		require.Equal(t, 3*time.Second, res.RetryAfter)
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, res.Err(), &rl)
		require.Equal(t, b, rl.Name)
		clk.Advance(3 * time.Second)
		require.True(t, limitAll(t, l, txlimit.Request{Name: b, Key: "k"}, txlimit.Request{Name: a, Key: "k"}).OK)
	})

	t.Run("Reservations", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 2, MaxReserved: 3},
			b: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Second},
		}, clk)
		// a goes 2 into debt as a reservation; b grants outright: the whole
		// call is OK, to run in 2s.
		res := limitAll(t, l, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(4), txlimit.Reserve()}}, txlimit.Request{Name: b, Key: "k"})
		require.True(t, res.OK)
		require.NoError(t, res.Err())
		require.Equal(t, 2*time.Second, res.RetryAfter)
		require.True(t, Reserved(res.Results[0]))
		require.InDelta(t, -2, res.Results[0].Remaining, 1e-9)
		require.InDelta(t, 9, res.Results[1].Remaining, 1e-9)
		// Beyond MaxReserved a denies, and b keeps its tokens.
		before := h.Rows(t, b, "k")
		res = limitAll(t, l, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(2), txlimit.Reserve()}}, txlimit.Request{Name: b, Key: "k"})
		require.False(t, res.OK)
		require.Equal(t, []string{a}, names(Denied(res)))
		require.Equal(t, before, h.Rows(t, b, "k"))
	})

	t.Run("RollbackGivesEveryLimitBack", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
			b: {Kind: txlimit.FixedWindow, Rate: 3, Period: time.Hour, Shards: 2},
		}, clk)
		require.True(t, limitAll(t, l, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"}).OK)
		beforeA, beforeB := h.Rows(t, a, "k"), h.Rows(t, b, "k")
		tx := h.Begin(t)
		res, err := l.LimitAllTx(ctx, tx, txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}})
		require.NoError(t, err)
		require.True(t, res.OK)
		h.Rollback(tx)
		require.Equal(t, beforeA, h.Rows(t, a, "k"))
		require.Equal(t, beforeB, h.Rows(t, b, "k"))
		require.True(t, limitAll(t, l, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}, txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}).OK)
	})

	t.Run("BadInputIsAnErrorAndWritesNothing", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
			b: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
		}, clk)
		cases := []struct {
			desc  string
			reqs  []txlimit.Request
			field string
		}{
			{"no request", nil, "reqs"},
			{"same key twice", []txlimit.Request{txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"}, txlimit.Request{Name: a, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}}}, "reqs"},
			{"unknown name last", []txlimit.Request{txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: "no-such-limit", Key: "k"}}, "name"},
			{"count above capacity", []txlimit.Request{txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k", Options: []txlimit.Option{txlimit.Count(4)}}}, "Count"},
			{"NUL in key", []txlimit.Request{txlimit.Request{Name: a, Key: "k"}, {Name: b, Key: "a\x00b"}}, "key"},
		}
		for _, tc := range cases {
			t.Run(tc.desc, func(t *testing.T) {
				tx := h.Begin(t)
				_, err := l.LimitAllTx(ctx, tx, tc.reqs...)
				var inv *txlimit.InvalidError
				require.ErrorAs(t, err, &inv)
				require.Equal(t, tc.field, inv.Field)
				require.NoError(t, h.Commit(tx))
				require.Empty(t, h.Rows(t, a, "k"))
				require.Empty(t, h.Rows(t, b, "k"))
			})
		}
		// The same key under two names is two limits, not a duplicate.
		require.True(t, limitAll(t, l, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"}).OK)
		// Inline configs work as in LimitTx.
		inline := UniqueName(t, "inline")
		res := limitAll(t, l, txlimit.Request{Name: inline, Key: "k", Options: []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour})}})
		require.True(t, res.OK)
		require.False(t, limitAll(t, l, txlimit.Request{Name: inline, Key: "k", Options: []txlimit.Option{txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour})}}).OK)
	})

	t.Run("OpposingOrdersNeverDeadlockAndAdmitExactly", func(t *testing.T) {
		const workers, callsEach = 16, 4
		// The names sort as a < b < c; half the workers ask for a, b, c and
		// half for c, b, a. b binds: 24 calls get through.
		a, b, c := UniqueName(t, "a"), UniqueName(t, "b"), UniqueName(t, "c")
		clk := NewClock()
		l := newLimiter(t, map[string]txlimit.Config{
			a: {Kind: txlimit.TokenBucket, Rate: 40, Period: time.Hour},
			b: {Kind: txlimit.FixedWindow, Rate: 24, Period: time.Hour, Shards: 4},
			c: {Kind: txlimit.TokenBucket, Rate: 30, Period: time.Hour, Shards: 2},
		}, clk)
		forward := []txlimit.Request{txlimit.Request{Name: a, Key: "hot"}, txlimit.Request{Name: b, Key: "hot"}, txlimit.Request{Name: c, Key: "hot"}}
		backward := []txlimit.Request{txlimit.Request{Name: c, Key: "hot"}, txlimit.Request{Name: b, Key: "hot"}, txlimit.Request{Name: a, Key: "hot"}}
		var admitted, denied atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers*callsEach)
		sem := make(chan struct{}, h.Conns)
		for w := range workers {
			reqs := forward
			if w%2 == 1 {
				reqs = backward
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range callsEach {
					res, err := func() (txlimit.MultiResult, error) {
						sem <- struct{}{}
						// Deferred: a failed begin ends this goroutine, and
						// its slot must not be lost with it.
						defer func() { <-sem }()
						tx := h.Begin(t)
						res, err := l.LimitAllTx(ctx, tx, reqs...)
						if err == nil {
							err = h.Commit(tx)
						} else {
							h.Rollback(tx)
						}
						return res, err
					}()
					switch {
					case err != nil:
						errs <- err
					case res.OK:
						admitted.Add(1)
					case len(Denied(res)) != 1 || Denied(res)[0].Name != b:
						errs <- fmt.Errorf("denied by %v, want %s only", names(Denied(res)), b)
					default:
						denied.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			// PostgreSQL's drivers (pgx, lib/pq) expose the SQLSTATE so.
			var coded interface{ SQLState() string }
			if errors.As(err, &coded) && coded.SQLState() == "40P01" {
				t.Errorf("deadlock: %v", err)
				continue
			}
			require.NoError(t, err)
		}
		require.EqualValues(t, 24, admitted.Load())
		require.EqualValues(t, workers*callsEach-24, denied.Load())
		require.InDelta(t, 16, value(t, l, a, "hot"), 1e-9)
		require.InDelta(t, 0, value(t, l, b, "hot"), 1e-9)
		require.InDelta(t, 6, value(t, l, c, "hot"), 1e-9)
	})
}

// names are the names of rs, in order.
func names(rs []txlimit.Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}
