package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runCommit is the suite's topic for the takes that end the transaction
// (CommitTx, Commit): the work of a denied transaction is gone with it,
// a granted one commits its work and its tokens together, all or none over
// several limits, under concurrency exactly. The work is a take from a
// limit of its own ("work", one key per transaction), whose rows say
// whether the transaction committed.
func runCommit[TTx any](t *testing.T, h Harness[TTx]) {
	e := env[TTx]{h: h, ctx: context.Background()}
	ctx := e.ctx
	clk := NewClock()
	hour := time.Hour
	bucket := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 3, Period: hour}
	work := UniqueName(t, "work")
	var events []txlimit.Event
	var mu sync.Mutex
	newLimiter := func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[TTx] {
		limits[work] = txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1e9, Period: hour}
		l, err := txlimit.New(h.Store, limits, &txlimit.Options{Clock: clk.Now, Observer: ObserverFunc(func(_ context.Context, ev txlimit.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		})})
		require.NoError(t, err)
		return l
	}
	var seq atomic.Int64
	// doWork is a transaction's work: it writes the row of a key of its
	// own, returned, of the work limit.
	doWork := func(l *txlimit.Limiter[TTx], key *string) func(tx TTx) error {
		*key = fmt.Sprintf("w%d", seq.Add(1))
		return func(tx TTx) error {
			_, err := l.LimitTx(ctx, tx, work, *key)
			return err
		}
	}
	committed := func(t *testing.T, key string) bool { return len(h.Rows(t, work, key)) > 0 }
	req := func(name, key string, opts ...txlimit.Option) txlimit.Request {
		return txlimit.Request{Name: name, Key: key, Options: opts}
	}

	t.Run("Commit", func(t *testing.T) {
		name := UniqueName(t, "send")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		for i := range 3 {
			var key string
			res, err := l.Commit(ctx, doWork(l, &key), req(name, "k"))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, float64(2-i), res.Results[0].Remaining)
			require.True(t, committed(t, key), "a grant commits the work")
		}
		before := h.Rows(t, name, "k")
		var key string
		res, err := l.Commit(ctx, doWork(l, &key), req(name, "k"))
		var rl *txlimit.RateLimitedError
		require.ErrorAs(t, err, &rl, "a denial is the error of the commit")
		require.Equal(t, 20*time.Minute, rl.RetryAfter)
		require.False(t, res.OK)
		require.Equal(t, 20*time.Minute, res.RetryAfter)
		require.Zero(t, res.Results[0].Taken)
		require.False(t, committed(t, key), "a denial leaves nothing of the transaction")
		require.Equal(t, before, h.Rows(t, name, "k"), "a denial writes nothing")

		clk.Advance(20 * time.Minute)
		res, err = l.Commit(ctx, doWork(l, &key), req(name, "k"))
		require.NoError(t, err)
		require.True(t, res.OK, "granted at RetryAfter")
		require.True(t, committed(t, key))
	})

	t.Run("CommitTx", func(t *testing.T) {
		name := UniqueName(t, "send")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		for i := range 4 {
			var key string
			tx := h.Begin(t)
			require.NoError(t, doWork(l, &key)(tx))
			res, err := l.CommitTx(ctx, tx, req(name, "k"))
			require.Equal(t, i < 3, res.OK)
			require.Equal(t, i < 3, err == nil, "%v", err)
			require.Equal(t, i < 3, committed(t, key))
			if i == 3 {
				require.ErrorIs(t, err, txlimit.ErrRateLimited)
			}
		}
	})

	t.Run("AllOrNone", func(t *testing.T) {
		a, b := UniqueName(t, "a"), UniqueName(t, "b")
		l := newLimiter(t, map[string]txlimit.Config{a: bucket, b: {Kind: txlimit.FixedWindow, Rate: 2, Period: hour}})
		_, err := l.Commit(ctx, func(TTx) error { return nil }, req(b, "k", txlimit.Count(2)))
		require.NoError(t, err)
		var key string
		res, err := l.Commit(ctx, doWork(l, &key), req(a, "k"), req(b, "k"))
		require.ErrorIs(t, err, txlimit.ErrRateLimited)
		require.False(t, committed(t, key))
		require.Equal(t, []bool{true, false}, []bool{res.Results[0].OK, res.Results[1].OK}, "each limit's own decision")
		require.Equal(t, float64(3), e.value(t, l, a, "k"), "nothing taken from the limit that granted")
		require.Empty(t, h.Rows(t, a, "k"))
	})

	t.Run("ErrorOfFn", func(t *testing.T) {
		name := UniqueName(t, "send")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		boom := errors.New("boom")
		var key string
		_, err := l.Commit(ctx, func(tx TTx) error {
			require.NoError(t, doWork(l, &key)(tx))
			return boom
		}, req(name, "k"))
		require.ErrorIs(t, err, boom, "fn's error as it is")
		require.False(t, committed(t, key))
		require.Empty(t, h.Rows(t, name, "k"), "nothing taken")
	})

	t.Run("Invalid", func(t *testing.T) {
		name := UniqueName(t, "send")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		ran := false
		_, err := l.Commit(ctx, func(TTx) error { ran = true; return nil }, req(name, "k", txlimit.Count(4)))
		var inv *txlimit.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "Count", inv.Field)
		require.False(t, ran, "requests are validated before the transaction begins")
		_, err = l.Commit(ctx, func(TTx) error { ran = true; return nil })
		require.ErrorAs(t, err, &inv)
		require.Equal(t, "reqs", inv.Field)

		// CommitTx leaves the transaction open on bad input.
		tx := h.Begin(t)
		var key string
		require.NoError(t, doWork(l, &key)(tx))
		_, err = l.CommitTx(ctx, tx, req(name, "k", txlimit.Count(-1)))
		require.ErrorAs(t, err, &inv)
		require.NoError(t, h.Commit(tx))
		require.True(t, committed(t, key))
	})

	t.Run("ShardsAndWindows", func(t *testing.T) {
		sharded, window := UniqueName(t, "sharded"), UniqueName(t, "window")
		l := newLimiter(t, map[string]txlimit.Config{
			sharded: {Kind: txlimit.TokenBucket, Rate: 8, Period: hour, Shards: 4},
			window:  {Kind: txlimit.SlidingWindow, Rate: 2, Period: hour},
		})
		for i := range 9 {
			_, err := l.Commit(ctx, func(TTx) error { return nil }, req(sharded, "k"))
			require.Equal(t, i < 8, err == nil, "call %d: %v", i, err)
		}
		for i := range 3 {
			_, err := l.Commit(ctx, func(TTx) error { return nil }, req(window, "k"))
			require.Equal(t, i < 2, err == nil, "sliding window call %d: %v", i, err)
		}
	})

	t.Run("ReserveAndUpToRefused", func(t *testing.T) {
		name := UniqueName(t, "send")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		for field, opt := range map[string]txlimit.Option{"Reserve": txlimit.Reserve(), "UpTo": txlimit.UpTo(2)} {
			ran := false
			_, err := l.Commit(ctx, func(TTx) error { ran = true; return nil }, req(name, "k", opt))
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv, field)
			require.Equal(t, field, inv.Field)
			require.Contains(t, inv.Problem, "LimitTx before the work")
			require.False(t, ran, field)
		}
		require.Empty(t, h.Rows(t, name, "k"))
	})

	t.Run("ReshardToOne", func(t *testing.T) {
		// Rows left by Shards 4 are pooled into one row (as LimitTx pools
		// them): the 4 tokens they hold are granted. A store may first deny
		// one call with RetryAfter 0 while it pools them.
		name := UniqueName(t, "reshard")
		four := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 8, Period: hour, Shards: 4}
		l := newLimiter(t, map[string]txlimit.Config{name: four})
		for range 4 {
			e.limit(t, l, name, "k")
		}
		one := four
		one.Shards = 1
		granted, retried := 0, 0
		for granted < 4 && retried <= 1 {
			res, err := l.Commit(ctx, func(TTx) error { return nil }, req(name, "k", txlimit.Inline(one)))
			if err == nil {
				granted++
				continue
			}
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
			require.Zero(t, res.RetryAfter, "a denial while the rows are pooled asks for a retry at once")
			retried++
		}
		require.Equal(t, 4, granted)
		_, err := l.Commit(ctx, func(TTx) error { return nil }, req(name, "k", txlimit.Inline(one)))
		require.ErrorIs(t, err, txlimit.ErrRateLimited)
		require.Len(t, h.Rows(t, name, "k"), 1)
	})

	t.Run("Exact", func(t *testing.T) {
		name := UniqueName(t, "exact")
		const capacity = 20
		l := newLimiter(t, map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: hour}})
		var keys sync.Map
		RequireExactAdmission(t, l, name, h.Conns-1, 6, capacity, func() (txlimit.Result, error) {
			var key string
			res, err := l.Commit(ctx, doWork(l, &key), req(name, "k"))
			if errors.Is(err, txlimit.ErrRateLimited) {
				err = nil
			}
			keys.Store(key, res.OK)
			if err != nil || res.Results == nil {
				return txlimit.Result{}, err
			}
			return res.Results[0], nil
		})
		keys.Range(func(k, ok any) bool {
			require.Equal(t, ok.(bool), committed(t, k.(string)), "work %v committed iff granted", k)
			return true
		})
	})

	t.Run("Leases", func(t *testing.T) { runLeases(t, h) })

	t.Run("Observer", func(t *testing.T) {
		name := UniqueName(t, "observed")
		l := newLimiter(t, map[string]txlimit.Config{name: bucket})
		mu.Lock()
		events = nil
		mu.Unlock()
		_, err := l.Commit(ctx, func(TTx) error { return nil }, req(name, "k"))
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, events, 1)
		require.Equal(t, "commit", events[0].Op)
		require.Equal(t, name, events[0].Name)
		require.True(t, events[0].Result.OK)
	})
}

// runLeases is the commit topic's part for Config.Lease: tokens handed out
// from a lease are exact under concurrency, go back to the lease when the
// transaction does not commit and to the limit when the lease ends, and a
// FixedWindow's lease ends with its window.
func runLeases[TTx any](t *testing.T, h Harness[TTx]) {
	e := env[TTx]{h: h, ctx: context.Background()}
	ctx := e.ctx
	hour := time.Hour
	req := func(name string) txlimit.Request { return txlimit.Request{Name: name, Key: "k"} }
	nothing := func(TTx) error { return nil }

	t.Run("HandedOutAndReturned", func(t *testing.T) {
		clk := NewClock()
		name := UniqueName(t, "leased")
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: hour, Lease: 4, LeaseFor: hour}}, clk)
		snap := func() txlimit.Result { return snapshot(t, l, name) }
		res, err := l.Commit(ctx, nothing, req(name))
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Equal(t, float64(1), res.Results[0].Taken)
		require.Equal(t, float64(6), snap().Remaining, "the lease took 4")
		require.Equal(t, float64(3), snap().Leased, "and handed out 1")

		boom := errors.New("boom")
		_, err = l.Commit(ctx, func(TTx) error { return boom }, req(name))
		require.ErrorIs(t, err, boom)
		require.Equal(t, float64(3), snap().Leased, "a transaction that failed gave its token back to the lease")

		require.NoError(t, l.ReturnLeases(ctx))
		require.Equal(t, float64(9), snap().Remaining, "ReturnLeases gives the unused tokens back")
		require.Equal(t, float64(0), snap().Leased)

		// 9 tokens left: 9 grants, then a denial with the limit's own wait.
		for i := range 10 {
			res, err := l.Commit(ctx, nothing, req(name))
			if i < 9 {
				require.NoError(t, err, "call %d", i)
				continue
			}
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
			require.Equal(t, 6*time.Minute, res.RetryAfter, "a token comes every 6 minutes")
		}
		require.Equal(t, float64(0), snap().Remaining+snap().Leased)
	})

	t.Run("Invalid", func(t *testing.T) {
		bucket := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: hour}
		for field, c := range map[string]func(c *txlimit.Config){
			"Lease":    func(c *txlimit.Config) { c.Lease = 11 },
			"Lease ":   func(c *txlimit.Config) { c.Lease = -1 },
			"Lease  ":  func(c *txlimit.Config) { c.Lease, c.Kind = 2, txlimit.SlidingWindow },
			"LeaseFor": func(c *txlimit.Config) { c.Lease, c.LeaseFor = 2, -time.Second },
			// LeaseFor without a Lease.
			"LeaseFor ": func(c *txlimit.Config) { c.LeaseFor = time.Second },
			// LeaseAhead: not a finite count >= 0, without a Lease, above
			// the Lease.
			"LeaseAhead":    func(c *txlimit.Config) { c.Lease, c.LeaseAhead = 2, -1 },
			"LeaseAhead ":   func(c *txlimit.Config) { c.Lease, c.LeaseAhead = 2, math.Inf(1) },
			"LeaseAhead  ":  func(c *txlimit.Config) { c.LeaseAhead = 1 },
			"LeaseAhead   ": func(c *txlimit.Config) { c.Lease, c.LeaseAhead = 2, 3 },
		} {
			cfg := bucket
			c(&cfg)
			_, err := txlimit.New(h.Store, map[string]txlimit.Config{"x": cfg}, nil)
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv, field)
			require.Equal(t, strings.TrimSpace(field), inv.Field, "%v", err)
		}
	})

	t.Run("LeaseForOnlyWithLease", func(t *testing.T) {
		// The normalized Config holds LeaseFor's default only when Lease
		// is set; LeaseFor without Lease names the fix.
		plain, leased := UniqueName(t, "plain"), UniqueName(t, "leased")
		l := e.limiter(t, map[string]txlimit.Config{
			plain:  {Kind: txlimit.TokenBucket, Rate: 10, Period: hour},
			leased: {Kind: txlimit.TokenBucket, Rate: 10, Period: hour, Lease: 4},
		}, NewClock())
		c, ok := l.Config(plain)
		require.True(t, ok)
		require.Zero(t, c.LeaseFor, "no Lease: no LeaseFor")
		c, ok = l.Config(leased)
		require.True(t, ok)
		require.Equal(t, time.Second, c.LeaseFor, "LeaseFor defaults to one second with a Lease")
		_, err := txlimit.New(h.Store, map[string]txlimit.Config{"x": {Kind: txlimit.TokenBucket, Rate: 10, Period: hour, LeaseFor: time.Minute}}, nil)
		require.ErrorContains(t, err, "set Lease too, or leave LeaseFor 0")
	})

	t.Run("AheadNamesTheFix", func(t *testing.T) {
		bucket := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: hour}
		for _, c := range []struct {
			lease, ahead float64
			fix          string
		}{
			{0, 1, "set Lease too, or leave LeaseAhead 0"},
			{4, 5, "set at most Lease, such as Lease/2"},
			{4, math.NaN(), "0: the next lease is taken when the lease runs out"},
		} {
			cfg := bucket
			cfg.Lease, cfg.LeaseAhead = c.lease, c.ahead
			_, err := txlimit.New(h.Store, map[string]txlimit.Config{"x": cfg}, nil)
			require.ErrorContains(t, err, c.fix)
		}
		cfg := bucket
		cfg.Lease, cfg.LeaseAhead = 4, 4
		_, err := txlimit.New(h.Store, map[string]txlimit.Config{"x": cfg}, nil)
		require.NoError(t, err, "LeaseAhead may equal Lease")
	})

	t.Run("AheadKeepsEachSliceDeadline", func(t *testing.T) {
		// A token bucket of 10 an hour (1/12 token per 30 s); leases of 4
		// lasting a minute, the next taken once one is down to 1.
		clk := NewClock()
		name := UniqueName(t, "ahead")
		l := aheadLimiter(t, e, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: hour,
			Lease: 4, LeaseAhead: 2, LeaseFor: time.Minute}}, clk)
		snap := func() txlimit.Result { return snapshot(t, l, name) }
		call := func(fn func(TTx) error) error {
			_, err := l.Commit(ctx, fn, req(name))
			return err
		}
		require.NoError(t, call(nothing))
		require.NoError(t, call(nothing))
		require.Equal(t, float64(6), snap().Remaining, "the first lease took 4")
		require.Equal(t, float64(2), snap().Leased, "and handed out 2: not below LeaseAhead")

		// 30 s on, the third call leaves 1 < LeaseAhead: the next lease,
		// 4 of 2 + 1/12, is taken in the background and lasts until a
		// minute after its own take.
		clk.Advance(30 * time.Second)
		require.NoError(t, call(nothing))
		require.Equal(t, float64(5), snap().Leased,
			"the lease taken ahead lands beside the one held (Check waits for it): Leased counts both")
		require.InDelta(t, 2+1.0/12, snap().Remaining, 1e-9)

		// A minute after the first take: its last token is over and dropped
		// (a credit now could add what the Capacity cut), while the one
		// taken ahead has 30 s to go and serves the call.
		clk.Advance(30 * time.Second)
		require.NoError(t, call(nothing))
		require.Equal(t, float64(3), snap().Leased)
		require.InDelta(t, 2+2.0/12, snap().Remaining, 1e-9, "the over lease's token was dropped, not credited")

		boom := errors.New("boom")
		require.ErrorIs(t, call(func(TTx) error { return boom }), boom)
		require.Equal(t, float64(3), snap().Leased, "a failed call gave its token back to the lease it came from")

		require.NoError(t, l.ReturnLeases(ctx))
		s := snapshot(t, l, name)
		require.Zero(t, s.Leased)
		require.InDelta(t, 10+2.0/12-4-1, s.Remaining, 1e-9, "10 + a minute's refill - 4 granted - 1 dropped")
	})

	t.Run("AheadStaysInItsWindow", func(t *testing.T) {
		// The lease taken ahead in a window's last minute holds that
		// window's tokens: it ends with the window, unspent, and the next
		// window admits exactly its Rate.
		clk := NewClock()
		name := UniqueName(t, "window")
		start := T0.Truncate(hour)
		clk.Advance(start.Add(hour - time.Minute).Sub(clk.Now()))
		l := aheadLimiter(t, e, map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: 10, Period: hour, Start: start,
			Lease: 4, LeaseAhead: 4, LeaseFor: 2 * hour}}, clk)
		_, err := l.Commit(ctx, nothing, req(name))
		require.NoError(t, err)
		require.Equal(t, float64(7), snapshot(t, l, name).Leased,
			"LeaseAhead = Lease: the next lease is taken at the first call")

		clk.Advance(start.Add(hour).Sub(clk.Now()))
		granted := grants(ctx, t, l, req(name), 12)
		require.Equal(t, 10, granted, "neither lease of the last window served this one")
		require.NoError(t, l.ReturnLeases(ctx))
		s := snapshot(t, l, name)
		require.Zero(t, s.Remaining+s.Leased)
	})

	t.Run("CommitTxTakesTheRow", func(t *testing.T) {
		// A lease's own transaction would wait for the caller's (SQLite's
		// one writer): CommitTx takes a leased limit from its row.
		clk := NewClock()
		name := UniqueName(t, "row")
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: hour, Lease: 4}}, clk)
		tx := h.Begin(t)
		_, err := l.CommitTx(ctx, tx, req(name))
		require.NoError(t, err)
		s := snapshot(t, l, name)
		require.Equal(t, float64(9), s.Remaining)
		require.Zero(t, s.Leased)
	})

	t.Run("EndsWithItsTime", func(t *testing.T) {
		clk := NewClock()
		name := UniqueName(t, "short")
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 10, Period: hour, Lease: 5, LeaseFor: time.Minute}}, clk)
		_, err := l.Commit(ctx, nothing, req(name))
		require.NoError(t, err)
		clk.Advance(time.Minute)
		_, err = l.Commit(ctx, nothing, req(name))
		require.NoError(t, err)
		s := snapshot(t, l, name)
		// The first lease ended unspent: a token bucket's lease gives its
		// tokens back within LeaseFor or drops them (a later credit could
		// add tokens the Capacity cut meanwhile), so its 4 are gone; a
		// minute refilled 1/6; the new lease took 5 and handed out 1.
		require.InDelta(t, 10-5-5+1.0/6, s.Remaining, 1e-9)
		require.Equal(t, float64(4), s.Leased)
	})

	t.Run("FixedWindowEndsWithTheWindow", func(t *testing.T) {
		clk := NewClock()
		name := UniqueName(t, "window")
		start := T0.Truncate(hour)
		l := e.limiter(t, map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: 10, Period: hour, Start: start, Lease: 4, LeaseFor: 2 * hour}}, clk)
		for range 3 {
			_, err := l.Commit(ctx, nothing, req(name))
			require.NoError(t, err)
		}
		// The next window: the lease taken in the last one is over, and
		// the window admits exactly its Rate.
		clk.Advance(start.Add(hour).Sub(clk.Now()))
		granted := grants(ctx, t, l, req(name), 12)
		require.Equal(t, 10, granted)
	})

	t.Run("Exact", func(t *testing.T) { exactLeases(t, e, 0) })
	t.Run("ExactAhead", func(t *testing.T) { exactLeases(t, e, 2) })
}

// exactLeases is runLeases' Exact: conns-1 callers on one key of a
// FixedWindow, leased 4 at a time (LeaseAhead ahead), some of whose
// transactions fail and are retried, are granted exactly its capacity.
func exactLeases[TTx any](t *testing.T, e env[TTx], ahead float64) {
	ctx, h, hour := e.ctx, e.h, time.Hour
	req := func(name string) txlimit.Request { return txlimit.Request{Name: name, Key: "k"} }
	clk := NewClock()
	name, work := UniqueName(t, "exact"), UniqueName(t, "work")
	const capacity = 30
	l := aheadLimiter(t, e, map[string]txlimit.Config{
		name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: hour, Lease: 4, LeaseAhead: ahead},
		work: {Kind: txlimit.TokenBucket, Rate: 1e9, Period: hour},
	}, clk)
	var seq atomic.Int64
	var committed sync.Map
	RequireExactAdmission(t, l, name, h.Conns-1, 8, capacity, func() (txlimit.Result, error) {
		for attempt := 0; ; attempt++ {
			key := fmt.Sprintf("w%d", seq.Add(1))
			// A third of the first attempts fail after their take:
			// the token goes back to the lease and another call
			// gets it.
			fail := attempt == 0 && seq.Load()%3 == 0
			res, err := l.Commit(ctx, func(tx TTx) error {
				if _, err := l.LimitTx(ctx, tx, work, key); err != nil {
					return err
				}
				if fail {
					return errFailed
				}
				return nil
			}, req(name))
			committed.Store(key, err == nil)
			switch {
			case errors.Is(err, errFailed):
				continue
			case errors.Is(err, txlimit.ErrRateLimited):
				return res.Results[0], nil
			case err != nil:
				return txlimit.Result{}, err
			}
			return res.Results[0], nil
		}
	})
	n := 0
	committed.Range(func(k, ok any) bool {
		require.Equal(t, ok.(bool), len(h.Rows(t, work, k.(string))) > 0, "work %v committed iff granted", k)
		if ok.(bool) {
			n++
		}
		return true
	})
	require.Equal(t, capacity, n)
	require.Zero(t, snapshot(t, l, name).Leased, "every leased token handed out")
	require.NoError(t, l.ReturnLeases(ctx))
	s := snapshot(t, l, name)
	require.Zero(t, s.Remaining+s.Leased, "and none left in the limit")
}

// aheadLimiter is env.limiter for limits with leases: the test ends by
// returning them, so that no take ahead is left in flight.
func aheadLimiter[TTx any](t *testing.T, e env[TTx], limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
	l := e.limiter(t, limits, clk)
	t.Cleanup(func() { require.NoError(t, l.ReturnLeases(e.ctx)) })
	return l
}

// grants makes n Commit calls of r with no work and counts the grants;
// every other call must be denied.
func grants[TTx any](ctx context.Context, t *testing.T, l *txlimit.Limiter[TTx], r txlimit.Request, n int) int {
	granted := 0
	for range n {
		if _, err := l.Commit(ctx, func(TTx) error { return nil }, r); err == nil {
			granted++
		} else {
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
		}
	}
	return granted
}

// snapshot is l's Check of name's key "k", asking for no token: Remaining
// and Leased.
func snapshot[TTx any](t *testing.T, l *txlimit.Limiter[TTx], name string) txlimit.Result {
	t.Helper()
	s, err := l.Check(context.Background(), name, "k", txlimit.Count(0))
	require.NoError(t, err)
	return s
}

var errFailed = errors.New("the work failed")
