package storetest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runConcurrency is the suite's topic for Concurrency limits: acquire,
// release, extend and reclaim on a frozen clock; all or none with a rate
// limit in LimitAll; exactly Capacity of 64 acquirers on connections of
// their own, at every isolation level the store supports (a harness of its
// own); Prune, Reset and Ping (a harness of its own); and a holder whose
// process is killed with SIGKILL, on the real clock.
func runConcurrency[TTx any](t *testing.T, h Harness[TTx], newHarness func(t *testing.T, conns int32) Harness[TTx]) {
	// Inside the gate shared, but for the 64 acquirers, alone (gate.go).
	leave := enterShared(t)
	defer func() {
		if leave != nil {
			leave()
		}
	}()
	ctx := context.Background()
	e := env[TTx]{h: h, ctx: ctx}
	slots := func(capacity float64, holdFor time.Duration) txlimit.Config {
		return txlimit.Config{Kind: txlimit.Concurrency, Capacity: capacity, HoldFor: holdFor}
	}
	var events eventLog
	limiter := func(t *testing.T, limits map[string]txlimit.Config, clk *Clock) *txlimit.Limiter[TTx] {
		t.Helper()
		l, err := txlimit.New(h.Store, limits, &txlimit.Options{Clock: clk.Now, Observer: events.add})
		require.NoError(t, err)
		return l
	}
	acquire := func(t *testing.T, l *txlimit.Limiter[TTx], name, key, holder string) txlimit.Result {
		t.Helper()
		return e.limit(t, l, name, key, txlimit.Holder(holder))
	}
	release := func(t *testing.T, l *txlimit.Limiter[TTx], name, key, holder string) bool {
		t.Helper()
		var ok bool
		e.inTx(t, func(tx TTx) {
			var err error
			ok, err = l.ReleaseTx(ctx, tx, name, key, holder)
			require.NoError(t, err)
		})
		return ok
	}
	extend := func(t *testing.T, l *txlimit.Limiter[TTx], name, key, holder string) bool {
		t.Helper()
		var ok bool
		e.inTx(t, func(tx TTx) {
			var err error
			ok, err = l.ExtendTx(ctx, tx, name, key, holder)
			require.NoError(t, err)
		})
		return ok
	}
	check := func(t *testing.T, l *txlimit.Limiter[TTx], name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		var res txlimit.Result
		e.inTx(t, func(tx TTx) {
			var err error
			res, err = l.CheckTx(ctx, tx, name, key, opts...)
			require.NoError(t, err)
		})
		return res
	}

	t.Run("AcquireCheckRelease", func(t *testing.T) {
		name := UniqueName(t, "slots")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(3, time.Minute)}, clk)
		require.Equal(t, 3.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
		for i, holder := range []string{"a", "b", "c"} {
			res := acquire(t, l, name, "k", holder)
			require.True(t, res.OK, holder)
			require.Equal(t, holder, res.Holder)
			require.Equal(t, float64(2-i), res.Remaining, "free slots after the call")
			require.Equal(t, 1.0, res.Taken)
			require.Zero(t, res.RetryAfter)
			require.WithinDuration(t, clk.Now(), res.At, 0)
		}
		res := acquire(t, l, name, "k", "d")
		require.False(t, res.OK)
		require.Equal(t, "d", res.Holder, "the id, also on a denial")
		require.Zero(t, res.Remaining)
		require.Zero(t, res.Taken)
		require.Equal(t, time.Minute, res.RetryAfter, "until the earliest expiry")
		require.ErrorIs(t, res.Err(), txlimit.ErrRateLimited)
		// Another key has slots of its own.
		require.True(t, acquire(t, l, name, "other", "d").OK)

		// Check: the free slots, and whether an acquire would be granted.
		res = check(t, l, name, "k")
		require.False(t, res.OK)
		require.Zero(t, res.Remaining)
		require.Equal(t, time.Minute, res.RetryAfter)
		require.True(t, check(t, l, name, "k", txlimit.Holder("b")).OK, "a live holder is granted again")
		require.True(t, check(t, l, name, "k", txlimit.Count(0)).OK)

		// Release: true once, false after; the slot is free again.
		require.True(t, release(t, l, name, "k", "b"))
		require.False(t, release(t, l, name, "k", "b"), "released already")
		require.False(t, release(t, l, name, "k", "never"), "never held")
		require.Equal(t, 1.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
		res = acquire(t, l, name, "k", "d")
		require.True(t, res.OK)
		require.Zero(t, res.Remaining)
		require.Equal(t, 2.0, check(t, l, name, "other", txlimit.Count(0)).Remaining, "the other key untouched")
	})

	t.Run("RollbackLeavesNoHolder", func(t *testing.T) {
		name := UniqueName(t, "rollback")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(1, time.Minute)}, clk)
		tx := h.Begin(t)
		res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Holder("a"))
		require.NoError(t, err)
		require.True(t, res.OK)
		h.Rollback(tx)
		require.Equal(t, 1.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
		require.False(t, release(t, l, name, "k", "a"), "the holder was never committed")
		require.True(t, acquire(t, l, name, "k", "b").OK)

		// Acquire and release in one transaction: nothing is left.
		name2 := UniqueName(t, "same-tx")
		l2 := limiter(t, map[string]txlimit.Config{name2: slots(1, time.Minute)}, clk)
		e.inTx(t, func(tx TTx) {
			res, err := l2.LimitTx(ctx, tx, name2, "k", txlimit.Holder("a"))
			require.NoError(t, err)
			require.True(t, res.OK)
			ok, err := l2.ReleaseTx(ctx, tx, name2, "k", "a")
			require.NoError(t, err)
			require.True(t, ok)
		})
		require.Equal(t, 1.0, check(t, l2, name2, "k", txlimit.Count(0)).Remaining)
	})

	t.Run("IdempotentAcquire", func(t *testing.T) {
		name := UniqueName(t, "again")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(2, time.Minute)}, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK)
		require.True(t, acquire(t, l, name, "k", "b").OK)
		clk.Advance(30 * time.Second)
		res := acquire(t, l, name, "k", "a")
		require.True(t, res.OK, "a live holder is granted again, the key full or not")
		require.Zero(t, res.Remaining, "and takes no second slot")
		// a's expiry moved to 30s + 1m: b expires first.
		res = acquire(t, l, name, "k", "c")
		require.False(t, res.OK)
		require.Equal(t, 30*time.Second, res.RetryAfter)
		clk.Advance(30 * time.Second)
		require.True(t, acquire(t, l, name, "k", "c").OK, "b expired")
		require.False(t, acquire(t, l, name, "k", "d").OK, "a was pushed, and is live")
	})

	t.Run("RetryAfterIsTheEarliestExpiry", func(t *testing.T) {
		name := UniqueName(t, "earliest")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(2, 10*time.Minute)}, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK) // expires at 10m
		clk.Advance(3 * time.Minute)
		require.True(t, acquire(t, l, name, "k", "b").OK) // at 13m
		clk.Advance(2 * time.Minute)
		res := acquire(t, l, name, "k", "c")
		require.False(t, res.OK)
		require.Equal(t, 5*time.Minute, res.RetryAfter)
		e.requireRetryAfter(t, l, clk, res, 5*time.Minute, name, "k", txlimit.Holder("c"))
		require.False(t, acquire(t, l, name, "k", "d").OK, "each holder expires on its own: b still holds its slot")

		// A Capacity lowered below the live holders: a slot comes back once
		// enough of them have expired.
		name2 := UniqueName(t, "lowered")
		wide := limiter(t, map[string]txlimit.Config{name2: slots(3, 10*time.Minute)}, clk)
		for i, holder := range []string{"a", "b", "c"} {
			if i > 0 {
				clk.Advance(time.Minute)
			}
			require.True(t, acquire(t, wide, name2, "k", holder).OK)
		}
		narrow := limiter(t, map[string]txlimit.Config{name2: slots(2, 10*time.Minute)}, clk)
		res = acquire(t, narrow, name2, "k", "d")
		require.False(t, res.OK)
		require.Zero(t, res.Remaining)
		require.Equal(t, 9*time.Minute, res.RetryAfter, "until a and b have expired")
	})

	t.Run("ReclaimOnAcquire", func(t *testing.T) {
		name := UniqueName(t, "reclaim")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(2, time.Minute)}, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK)
		require.True(t, acquire(t, l, name, "k", "b").OK)
		clk.Advance(time.Minute) // both expire now
		require.Equal(t, 2.0, check(t, l, name, "k", txlimit.Count(0)).Remaining, "an expired holder holds no slot")
		events.reset()
		res := acquire(t, l, name, "k", "c")
		require.True(t, res.OK)
		require.Equal(t, 1.0, res.Remaining)
		got := events.of(name)
		require.Len(t, got, 3, "the acquire, then one reclaim per expired holder")
		require.Equal(t, "limit", got[0].Op)
		require.Equal(t, "c", got[0].Holder)
		var reclaimed []string
		for _, ev := range got[1:] {
			require.Equal(t, "reclaim", ev.Op)
			require.Equal(t, "k", ev.Key)
			require.Equal(t, 1.0, ev.Count)
			reclaimed = append(reclaimed, ev.Holder)
		}
		require.ElementsMatch(t, []string{"a", "b"}, reclaimed)
		require.False(t, release(t, l, name, "k", "a"), "reclaimed")
		// A denied acquire reclaims nothing and writes nothing.
		require.True(t, acquire(t, l, name, "k", "d").OK)
		events.reset()
		require.False(t, acquire(t, l, name, "k", "e").OK)
		require.Len(t, events.of(name), 1)
	})

	t.Run("ExtendAfterReclaim", func(t *testing.T) {
		name := UniqueName(t, "extend")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(1, time.Minute)}, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK)
		clk.Advance(50 * time.Second)
		events.reset()
		require.True(t, extend(t, l, name, "k", "a"), "live: extended to 50s + 1m")
		ev := events.of(name)
		require.Len(t, ev, 1)
		require.Equal(t, "extend", ev[0].Op)
		require.Equal(t, "a", ev[0].Holder)
		require.True(t, ev[0].Result.OK)
		clk.Advance(50 * time.Second)
		res := acquire(t, l, name, "k", "b")
		require.False(t, res.OK, "the extended holder is live")
		require.Equal(t, 10*time.Second, res.RetryAfter)
		clk.Advance(10 * time.Second)
		require.True(t, acquire(t, l, name, "k", "b").OK, "a expired, reclaimed by b")
		require.False(t, extend(t, l, name, "k", "a"), "a was reclaimed: its work must stop")
		require.True(t, extend(t, l, name, "k", "b"))
		require.False(t, extend(t, l, name, "k", "never"))
		require.False(t, extend(t, l, name, "nokey", "a"), "a key never acquired")
		clk.Advance(time.Minute - time.Microsecond)
		require.False(t, acquire(t, l, name, "k", "c").OK, "b was extended to a minute after it")
		clk.Advance(time.Microsecond)
		require.False(t, extend(t, l, name, "k", "b"), "expired exactly at its expiry")
		require.True(t, acquire(t, l, name, "k", "c").OK)
	})

	t.Run("LimitAllWithARateLimit", func(t *testing.T) {
		sl, rate := UniqueName(t, "slots"), UniqueName(t, "rate")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{
			sl:   slots(1, time.Minute),
			rate: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		}, clk)
		limitAllOn := func(slotKey, holder string) txlimit.MultiResult {
			var res txlimit.MultiResult
			e.inTx(t, func(tx TTx) {
				var err error
				res, err = l.LimitAllTx(ctx, tx,
					txlimit.Request{Name: sl, Key: slotKey, Options: []txlimit.Option{txlimit.Holder(holder)}},
					txlimit.Request{Name: rate, Key: "k"})
				require.NoError(t, err)
			})
			return res
		}
		limitAll := func(holder string) txlimit.MultiResult { return limitAllOn("k", holder) }
		res := limitAll("a")
		require.True(t, res.OK)
		require.Equal(t, "a", res.Results[0].Holder)
		require.Zero(t, res.Results[0].Remaining)
		require.Equal(t, 1.0, res.Results[1].Remaining)

		// The slot is full: no token is taken.
		res = limitAll("b")
		require.False(t, res.OK)
		require.False(t, res.Results[0].OK)
		require.True(t, res.Results[1].OK, "the rate limit alone would grant")
		require.Equal(t, time.Minute, res.RetryAfter)
		require.Equal(t, 1.0, e.value(t, l, rate, "k"), "a full Concurrency limit takes no token")

		// The rate limit denies: no holder is left.
		require.True(t, release(t, l, sl, "k", "a"))
		require.True(t, e.limit(t, l, rate, "k").OK) // the last token
		res = limitAll("c")
		require.False(t, res.OK)
		require.True(t, res.Results[0].OK, "the slot alone would grant")
		require.False(t, res.Results[1].OK)
		require.Equal(t, 30*time.Minute, res.RetryAfter)
		require.Equal(t, 1.0, check(t, l, sl, "k", txlimit.Count(0)).Remaining, "a denied rate limit leaves no holder")
		require.False(t, release(t, l, sl, "k", "c"))

		// So on a key never acquired before.
		res = limitAllOn("new", "d")
		require.False(t, res.OK)
		require.True(t, res.Results[0].OK)
		require.Equal(t, 1.0, check(t, l, sl, "new", txlimit.Count(0)).Remaining)
		clk.Advance(30 * time.Minute)
		require.True(t, limitAllOn("new", "d").OK)
		require.Zero(t, e.value(t, l, rate, "k"))
	})

	t.Run("Reset", func(t *testing.T) {
		name := UniqueName(t, "reset")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{name: slots(2, time.Minute)}, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK)
		require.True(t, acquire(t, l, name, "k", "b").OK)
		e.inTx(t, func(tx TTx) { require.NoError(t, l.ResetTx(ctx, tx, name, "k")) })
		require.Equal(t, 2.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
		require.False(t, release(t, l, name, "k", "a"))
		require.False(t, extend(t, l, name, "k", "b"))
		// A Limiter without the config clears the holders too.
		bare := limiter(t, nil, clk)
		require.True(t, acquire(t, l, name, "k", "a").OK)
		e.inTx(t, func(tx TTx) { require.NoError(t, bare.ResetTx(ctx, tx, name, "k")) })
		require.Equal(t, 2.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
	})

	t.Run("InlineAndFormsWithoutTx", func(t *testing.T) {
		name := UniqueName(t, "inline")
		clk := NewClock()
		cfg := txlimit.Inline(slots(1, time.Minute))
		l := limiter(t, nil, clk)
		res, err := l.Limit(ctx, name, "k", cfg)
		if noPool(err) {
			t.Skip("the store has no pool")
		}
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Len(t, res.Holder, 32, "a random id of 32 hex digits")
		other, err := l.Limit(ctx, name, "k", cfg)
		require.NoError(t, err)
		require.False(t, other.OK)
		require.NotEqual(t, res.Holder, other.Holder)
		ok, err := l.Extend(ctx, name, "k", res.Holder, cfg)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = l.Release(ctx, name, "k", res.Holder)
		require.NoError(t, err)
		require.True(t, ok)
		all, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: "k", Options: []txlimit.Option{cfg}})
		require.NoError(t, err)
		require.True(t, all.OK)
		checked, err := l.Check(ctx, name, "k", cfg, txlimit.Count(0))
		require.NoError(t, err)
		require.Zero(t, checked.Remaining)
	})

	t.Run("InvalidInput", func(t *testing.T) {
		name, rate := UniqueName(t, "slots"), UniqueName(t, "rate")
		clk := NewClock()
		l := limiter(t, map[string]txlimit.Config{
			name: slots(2, time.Minute),
			rate: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
		}, clk)
		invalid := func(t *testing.T, err error, field, says string) {
			t.Helper()
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, field, inv.Field, inv.Error())
			require.Contains(t, inv.Error(), says)
		}
		for _, tc := range []struct {
			cfg   txlimit.Config
			field string
		}{
			{txlimit.Config{Kind: txlimit.Concurrency, HoldFor: time.Minute}, "Capacity"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 1.5, HoldFor: time.Minute}, "Capacity"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2}, "HoldFor"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Microsecond}, "HoldFor"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, Rate: 1}, "Rate"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, Period: time.Second}, "Period"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, Shards: 2}, "Shards"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, Lease: 1}, "Lease"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, MaxReserved: 1}, "MaxReserved"},
			{txlimit.Config{Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute, Zone: "UTC"}, "Zone"},
			{txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, HoldFor: time.Minute}, "HoldFor"},
		} {
			_, err := txlimit.New(h.Store, map[string]txlimit.Config{"x": tc.cfg}, nil)
			invalid(t, err, tc.field, "")
		}
		tx := h.Begin(t)
		_, err := l.LimitTx(ctx, tx, name, "k", txlimit.Count(2))
		invalid(t, err, "Count", "one slot")
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Count(0))
		invalid(t, err, "Count", "Check")
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.UpTo(1))
		invalid(t, err, "UpTo", "")
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Reserve())
		invalid(t, err, "Reserve", "")
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Holder(""))
		invalid(t, err, "Holder", "empty")
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Holder(strings.Repeat("h", 257)))
		invalid(t, err, "Holder", "256")
		_, err = l.LimitTx(ctx, tx, rate, "k", txlimit.Holder("a"))
		invalid(t, err, "Holder", "Concurrency limits only")
		_, err = l.ReleaseTx(ctx, tx, rate, "k", "a")
		invalid(t, err, "name", "Concurrency")
		_, err = l.ExtendTx(ctx, tx, name, "k", "a", txlimit.Count(2))
		invalid(t, err, "opts", "Inline")
		_, err = l.ExtendTx(ctx, tx, UniqueName(t, "unknown"), "k", "a")
		RequireUnknownLimit(t, err)
		err = l.CreditTx(ctx, tx, name, "k", 1)
		invalid(t, err, "name", "Release")
		_, err = l.Wait(ctx, name, "k")
		invalid(t, err, "name", "Wait")
		// The forms whose work is fixed already name LimitTx.
		_, err = l.CommitTx(ctx, tx, txlimit.Request{Name: name, Key: "k"})
		invalid(t, err, "Kind", "LimitTx")
		_, err = l.Commit(ctx, func(TTx) error { return nil }, txlimit.Request{Name: rate, Key: "k"}, txlimit.Request{Name: name, Key: "k"})
		invalid(t, err, "Kind", "LimitTx")
		h.Rollback(tx)
		// Nothing was written by any of them.
		require.Equal(t, 2.0, check(t, l, name, "k", txlimit.Count(0)).Remaining)
	})

	t.Run("PrunePing", func(t *testing.T) {
		own := newHarness(t, 3)
		oe := env[TTx]{h: own, ctx: ctx}
		name, rate := UniqueName(t, "prune"), UniqueName(t, "rate")
		clk := NewClock()
		l, err := txlimit.New(own.Store, map[string]txlimit.Config{
			name: slots(3, time.Minute),
			rate: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		}, &txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		require.True(t, oe.limit(t, l, rate, "k").OK) // a row Prune keeps
		for _, key := range []string{"k1", "k2"} {
			require.True(t, oe.limit(t, l, name, key, txlimit.Holder("a")).OK)
			require.True(t, oe.limit(t, l, name, key, txlimit.Holder("b")).OK)
		}
		clk.Advance(30 * time.Second)
		require.True(t, oe.limit(t, l, name, "k1", txlimit.Holder("c")).OK) // k1 expires at 1m30s
		res, err := l.Prune(ctx, nil)
		if noPool(err) {
			t.Skip("the store has no pool")
		}
		require.NoError(t, err)
		require.Zero(t, res.Deleted, "nothing has expired")
		clk.Advance(30 * time.Second)
		res, err = l.Prune(ctx, &txlimit.PruneOptions{BatchSize: 2})
		require.NoError(t, err)
		require.Equal(t, 5, res.Deleted, "a and b of k1; a, b and the lock row of k2")
		require.True(t, res.Complete)
		require.Equal(t, 2.0, oe.value(t, l, name, "k1"), "c is live")
		require.Equal(t, 3.0, oe.value(t, l, name, "k2"))
		clk.Advance(time.Hour)
		res, err = l.Prune(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, 3, res.Deleted, "c and the lock row of k1, and the rate limit's row, refilled")
		res, err = l.Prune(ctx, nil)
		require.NoError(t, err)
		require.Zero(t, res.Deleted)
		require.Equal(t, 3.0, oe.value(t, l, name, "k1"))
		// A Limiter without Concurrency limits leaves txlimit_holder alone.
		require.True(t, oe.limit(t, l, name, "k3", txlimit.Holder("a")).OK)
		require.True(t, oe.limit(t, l, rate, "k").OK)
		clk.Advance(time.Hour)
		rateOnly, err := txlimit.New(own.Store, map[string]txlimit.Config{rate: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}},
			&txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		res, err = rateOnly.Prune(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, txlimit.PruneResult{Deleted: 1, Keys: 1, Batches: 2, Complete: true}, res, "the rate limit's row, refilled (and a batch of idempotency keys)")
		res, err = l.Prune(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, 2, res.Deleted, "a and the lock row of k3")

		// Ping checks txlimit_holder too.
		require.NoError(t, l.Ping(ctx))
		tx := own.Begin(t)
		require.NoError(t, own.Exec(ctx, tx, "DROP TABLE txlimit_holder"))
		require.NoError(t, own.Commit(tx))
		require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated)
		tx = own.Begin(t)
		_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Holder("a"))
		own.Rollback(tx)
		require.ErrorIs(t, err, txlimit.ErrNotMigrated)
	})

	leave()
	leave = nil
	t.Run("ExactlyCapacityOf64", func(t *testing.T) {
		require.NotNil(t, h.BeginLevel, "the harness says how to begin at an isolation level")
		require.NotEmpty(t, h.Levels)
		enterAlone(t, h)
		big := newHarness(t, acquirers+1)
		for _, level := range h.Levels {
			t.Run(levelName(level), func(t *testing.T) { exactlyCapacity(t, big, level) })
		}
	})

	leave = enterShared(t)
	t.Run("KilledHolder", func(t *testing.T) { killedHolder(t, h) })
}

// acquirers is how many transactions acquire a slot at once in
// ExactlyCapacityOf64, each on a connection of its own.
const acquirers = 64

// exactlyCapacity runs acquirers transactions at level, each on a
// connection of its own, that acquire a slot of one key of a limit of 5 at
// once, half of them with LimitTx and half with LimitAllTx beside a rate
// limit that has tokens for all (the stores' two ways to acquire), and
// requires that exactly 5 commit a grant and every other one a denial. A transaction that fails with an error the store calls
// retryable (a serialization failure under REPEATABLE READ and
// SERIALIZABLE, a deadlock, a busy SQLite database) runs again, as an
// application runs it again; an admission beyond 5 would show as a sixth
// grant.
func exactlyCapacity[TTx any](t *testing.T, h Harness[TTx], level sql.IsolationLevel) {
	const capacity = 5
	ctx := context.Background()
	name, rate := UniqueName(t, "exact"), UniqueName(t, "rate")
	l, err := txlimit.New(h.Store, map[string]txlimit.Config{
		name: {Kind: txlimit.Concurrency, Capacity: capacity, HoldFor: time.Hour},
		rate: {Kind: txlimit.TokenBucket, Rate: 1000, Period: time.Hour},
	}, nil)
	require.NoError(t, err)
	once := func(holder string, all bool) (bool, error) {
		tx, err := h.BeginLevel(ctx, level)
		if err != nil {
			return false, err
		}
		// Under REPEATABLE READ, a read of a table first: the snapshot is
		// then older than the lock the acquire waits for (InnoDB takes it
		// at the first read of a table, PostgreSQL at the first statement).
		// Not under SERIALIZABLE, where InnoDB makes it a locking read of
		// the whole table, which the takes then deadlock on.
		if level == sql.LevelRepeatableRead {
			if err := h.Exec(ctx, tx, "SELECT COUNT(*) FROM txlimit"); err != nil {
				h.Rollback(tx)
				return false, err
			}
		}
		var ok bool
		if all {
			var res txlimit.MultiResult
			res, err = l.LimitAllTx(ctx, tx, txlimit.Request{Name: name, Key: "k", Options: []txlimit.Option{txlimit.Holder(holder)}},
				txlimit.Request{Name: rate, Key: "k"})
			ok = res.OK
		} else {
			var res txlimit.Result
			res, err = l.LimitTx(ctx, tx, name, "k", txlimit.Holder(holder))
			ok = res.OK
		}
		if err != nil {
			h.Rollback(tx)
			return false, err
		}
		return ok, h.Commit(tx)
	}
	var granted, denied atomic.Int64
	var grantedTo sync.Map
	retried := together(t, h, acquirers, func(i int) error {
		holder := fmt.Sprintf("h%02d", i)
		ok, err := once(holder, i%2 == 1)
		switch {
		case err == nil && ok:
			granted.Add(1)
			grantedTo.Store(holder, true)
		case err == nil:
			denied.Add(1)
		}
		return err
	})
	t.Logf("%s: %d granted, %d denied, %d retryable failures run again", levelName(level), granted.Load(), denied.Load(), retried)
	require.EqualValues(t, capacity, granted.Load(), "exactly Capacity admitted")
	require.EqualValues(t, acquirers-capacity, denied.Load())

	// The holders are the ones granted, and nobody else.
	e := env[TTx]{h: h, ctx: ctx}
	e.inTx(t, func(tx TTx) {
		res, err := l.CheckTx(ctx, tx, name, "k", txlimit.Count(0))
		require.NoError(t, err)
		require.Zero(t, res.Remaining)
	})
	released := 0
	for i := range acquirers {
		holder := fmt.Sprintf("h%02d", i)
		ok, err := l.Release(ctx, name, "k", holder)
		if noPool(err) {
			e.inTx(t, func(tx TTx) { ok, err = l.ReleaseTx(ctx, tx, name, "k", holder) })
		}
		require.NoError(t, err)
		_, wasGranted := grantedTo.Load(holder)
		require.Equal(t, wasGranted, ok, holder)
		if ok {
			released++
		}
	}
	require.Equal(t, capacity, released)
}

// levelName is level as a subtest's name: "read_committed".
func levelName(level sql.IsolationLevel) string {
	return strings.ReplaceAll(strings.ToLower(level.String()), " ", "_")
}

// The environment of holderChild, besides ChildDatabase.
const (
	childName    = "TXLIMIT_STORETEST_HOLDER_NAME"
	childHoldFor = "TXLIMIT_STORETEST_HOLDER_HOLD_FOR"
	childLine    = "txlimit-storetest-holder:" // what the child prints once it holds its slot
)

// killedHolder: a process holding a slot, killed with SIGKILL, frees it at
// its expiry and not before. The child (the test binary run again, on the
// same database: holderChild) acquires the only slot of a key, commits, says
// so and waits to be killed. On the database's clock, every acquire after
// its death is then denied while At is before the holder's expiry, with
// RetryAfter until it; one is denied in the last half of HoldFor; and the
// first grant comes at the expiry or later and reclaims the dead holder.
func killedHolder[TTx any](t *testing.T, h Harness[TTx]) {
	require.NotNil(t, h.Database, "the harness names its database for a process of its own")
	ctx := context.Background()
	const holdFor = 3 * time.Second
	name := UniqueName(t, "killed")
	cfg := map[string]txlimit.Config{name: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: holdFor}}

	// The child runs the test that called Run, and Run sends it to
	// holderChild: the pattern names that test's path.
	parts := strings.Split(t.Name(), "/")
	parts = parts[:len(parts)-2] // …/concurrency/KilledHolder
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), ChildDatabase+"="+h.Database(t), childName+"="+name, childHoldFor+"="+holdFor.String())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	lines := make(chan string, 1)
	var transcript lockedBuffer
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			transcript.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), childLine) {
				lines <- sc.Text()
			}
		}
		_, _ = io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var heldAt time.Time
	select {
	case line := <-lines:
		us, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, childLine)), 10, 64)
		require.NoError(t, err, line)
		heldAt = time.UnixMicro(us)
	case err := <-exited:
		killed = true
		t.Fatalf("the child exited before it held its slot (%v):\n%s%s", err, transcript.String(), stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the child did not hold its slot in 2 minutes:\n%s%s", transcript.String(), stderr.String())
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = <-exited
	killed = true
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"the child died of SIGKILL, not on its own (%v):\n%s%s", err, transcript.String(), stderr.String())

	var events eventLog
	l, err := txlimit.New(h.Store, cfg, &txlimit.Options{Observer: events.add})
	require.NoError(t, err)
	e := env[TTx]{h: h, ctx: ctx}
	expiry := heldAt.Add(holdFor)
	var lateDenial bool
	for attempt := 0; ; attempt++ {
		res := e.limit(t, l, name, "k", txlimit.Holder("parent"))
		if !res.OK {
			require.True(t, res.At.Before(expiry), "denied at %v, at or after the expiry %v", res.At, expiry)
			require.Equal(t, expiry.Sub(res.At), res.RetryAfter, "a denial says when the dead holder's slot comes back")
			lateDenial = lateDenial || !res.At.Before(expiry.Add(-holdFor/2))
			// Sleep to a little before the expiry, then in short steps.
			time.Sleep(max(min(res.RetryAfter-250*time.Millisecond, res.RetryAfter/2), 20*time.Millisecond))
			require.Less(t, attempt, 10_000)
			continue
		}
		require.False(t, res.At.Before(expiry), "granted at %v, before the expiry %v", res.At, expiry)
		break
	}
	require.True(t, lateDenial, "the dead holder's slot was still held in the last half of HoldFor")
	var reclaimed []string
	for _, ev := range events.of(name) {
		if ev.Op == "reclaim" {
			reclaimed = append(reclaimed, ev.Holder)
		}
	}
	require.Equal(t, []string{"child"}, reclaimed)
}

// holderChild is Run in the process killedHolder starts: it acquires the
// only slot of the key "k" of the limit the environment names as the
// holder "child", commits, prints childLine and the grant's instant (Unix
// µs), and waits to be killed.
func holderChild[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	name := os.Getenv(childName)
	holdFor, err := time.ParseDuration(os.Getenv(childHoldFor))
	require.NoError(t, err)
	l, err := txlimit.New(h.Store, map[string]txlimit.Config{name: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: holdFor}}, nil)
	require.NoError(t, err)
	tx := h.Begin(t)
	res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Holder("child"))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, h.Commit(tx))
	fmt.Printf("%s %d\n", childLine, res.At.UnixMicro())
	for {
		time.Sleep(time.Hour)
	}
}

// eventLog collects the Events of an Observer.
type eventLog struct {
	mu     sync.Mutex
	events []txlimit.Event
}

func (l *eventLog) add(_ context.Context, e txlimit.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = nil
}

// of returns the Events of the limit name, in order.
func (l *eventLog) of(name string) []txlimit.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []txlimit.Event
	for _, e := range l.events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// lockedBuffer is a strings.Builder safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(s)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// together runs call(0) … call(n-1) on goroutines of their own, released at
// once, and runs a call again while it fails with an error the store calls
// retryable (a serialization failure, a deadlock, a busy SQLite database),
// as an application runs its transaction again, at most 200 times. It
// fails t on any other error and returns how many failures ran again.
func together[TTx any](t *testing.T, h Harness[TTx], n int, call func(i int) error) int64 {
	var retried atomic.Int64
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			for attempt := 1; ; attempt++ {
				err := call(i)
				switch {
				case err == nil:
					return
				case !h.Retryable(err) || attempt == 200:
					errs <- fmt.Errorf("call %d, attempt %d: %w", i, attempt, err)
					return
				}
				retried.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return retried.Load()
}
