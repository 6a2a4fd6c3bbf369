package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runRemaining checks Result.Remaining and NextToken on every path a call
// can take: one row, a sharded limit's one free shard (PostgreSQL), the lock
// of every shard, a denial from the unlocked read, Check, a reservation.
func runRemaining[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	one, sharded, reported, fw := UniqueName(t, "one"), UniqueName(t, "sharded"), UniqueName(t, "reported"), UniqueName(t, "fw")
	shardedCfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 16, Period: 16 * time.Second, Shards: 4}
	// The same limit, told to report Remaining on every call.
	reporting := shardedCfg
	reporting.ReportRemaining = true
	clk := NewClock()
	l, err := txlimit.New(h.Store, map[string]txlimit.Config{
		one:      {Kind: txlimit.TokenBucket, Rate: 10, Period: 10 * time.Second},
		sharded:  shardedCfg,
		reported: reporting,
		fw:       {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Minute, Start: T0.Add(-20 * time.Second)},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	callKey := func(check bool, name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		tx := h.Begin(t)
		f := l.LimitTx
		if check {
			f = l.CheckTx
		}
		res, err := f(ctx, tx, name, key, opts...)
		require.NoError(t, err)
		require.NoError(t, h.Commit(tx))
		return res
	}
	call := func(check bool, name string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		return callKey(check, name, "k", opts...)
	}
	type want struct {
		ok        bool
		remaining float64
		next      time.Duration
	}
	got := func(r txlimit.Result) want { return want{r.OK, r.Remaining, r.NextToken} }

	// A token a second. 10 - 3 = 7; the 8th token is a second away.
	require.Equal(t, want{true, 7, time.Second}, got(call(false, one, txlimit.Count(3))))
	// A full limit gains nothing: NextToken is 0.
	require.Equal(t, want{true, 10, 0}, got(callKey(true, one, "unused", txlimit.Count(0))))
	clk.Advance(500 * time.Millisecond)
	require.Equal(t, want{true, 7.5, 500 * time.Millisecond}, got(call(true, one)), "Check takes nothing")
	require.Equal(t, want{false, 7.5, 500 * time.Millisecond}, got(call(false, one, txlimit.Count(8))))

	// 16 tokens in 4 shards of 4, a token a second.
	require.Equal(t, want{true, 15, time.Second}, got(call(false, sharded)), "first call: every shard created")
	require.Equal(t, want{true, 14, time.Second}, got(call(false, sharded, txlimit.Inline(reporting))),
		"Config.ReportRemaining: one free shard on PostgreSQL, the others read in the same statement")
	// Given to New, it holds for every call of the limit.
	require.Equal(t, want{true, 15, time.Second}, got(call(false, reported)))
	res := call(false, reported)
	require.Equal(t, want{true, 14, time.Second}, got(res))
	require.False(t, res.Partial)
	res = call(false, sharded)
	if h.SkipsLocked {
		// Every shard holds at least 2.75: the one free shard grants, and
		// without ReportRemaining the others are not read.
		require.Equal(t, txlimit.Result{Name: sharded, Key: "k", Count: 1, Taken: 1, OK: true, At: res.At, Partial: true}, res)
	} else {
		require.Equal(t, want{true, 13, time.Second}, got(res))
		require.False(t, res.Partial)
	}
	require.Equal(t, want{true, 8, time.Second}, got(call(false, sharded, txlimit.Count(5))), "above a shard: every shard locked")
	require.Equal(t, want{true, 8, time.Second}, got(call(true, sharded)))
	require.Equal(t, want{false, 8, time.Second}, got(call(false, sharded, txlimit.Count(9))), "denied")
	res = call(false, sharded, txlimit.Count(10), txlimit.Reserve())
	require.Equal(t, want{true, -2, 3 * time.Second}, got(res), "2 in debt; 1 whole token in 3s")
	require.Equal(t, 2*time.Second, res.RetryAfter)
	require.False(t, res.Partial)

	// Windows start at :40 and the clock reads 12:00:00.5; 5 tokens a
	// window.
	require.Equal(t, want{true, 3, 39500 * time.Millisecond}, got(call(false, fw, txlimit.Count(2))))
	require.Equal(t, want{false, 3, 39500 * time.Millisecond}, got(call(false, fw, txlimit.Count(4))))
}
