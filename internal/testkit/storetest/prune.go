package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// runPrune is what Prune deletes and what it keeps, on every store.
// Prune goes through the whole table, so h must be a store of its own.
func runPrune[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := context.Background()
	tb := UniqueName(t, "tb")
	fw := UniqueName(t, "fw")
	sharded := UniqueName(t, "sharded")
	unknown := UniqueName(t, "unknown")
	limits := map[string]txlimit.Config{
		tb: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		// Windows start at T0: a per-key phase (from the hash of a random
		// name) put a window boundary in the first 6 s once in 600 runs.
		fw:      {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Start: T0},
		sharded: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4},
	}
	unknownCfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}
	clk := NewClock()
	l, err := txlimit.New(h.Store, limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	limitTx := func(name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		tx := h.Begin(t)
		res, err := l.LimitTx(ctx, tx, name, key, opts...)
		require.NoError(t, err)
		require.NoError(t, h.Commit(tx))
		return res
	}

	for i := range 5 {
		require.True(t, limitTx(tb, fmt.Sprint("k", i)).OK)
	}
	require.True(t, limitTx(fw, "k").OK)
	require.True(t, limitTx(sharded, "k", txlimit.Count(8)).OK) // all 4 shards empty
	require.True(t, limitTx(unknown, "k", txlimit.Inline(unknownCfg)).OK)

	// Nothing has refilled yet.
	res, err := l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Keys: 8, Unknown: 1, Batches: 2, Complete: true}, res, "a batch of keys, and one of expired idempotency keys")

	// 6s later the token buckets of 10/min have their token back; the
	// sharded limit has 0.8 of its 8, the fixed window waits for its next
	// window.
	clk.Advance(6 * time.Second)
	res, err = l.Prune(ctx, &txlimit.PruneOptions{BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Deleted: 5, Keys: 8, Unknown: 1, Batches: 6, Complete: true}, res, "4 full batches, then one that finds the end, then the idempotency keys'")
	for i := range 5 {
		require.Empty(t, h.Rows(t, tb, fmt.Sprint("k", i)))
	}
	require.Len(t, h.Rows(t, fw, "k"), 1)
	require.Len(t, h.Rows(t, sharded, "k"), 4)
	require.Len(t, h.Rows(t, unknown, "k"), 1, "a name without a config is left alone")

	// One shard full and three not: the key keeps all four rows.
	clk.Advance(time.Hour)
	tx := h.Begin(t)
	require.NoError(t, l.CreditTx(ctx, tx, sharded, "k", 8)) // full
	_, err = l.LimitTx(ctx, tx, sharded, "k", txlimit.Count(6))
	require.NoError(t, err)
	require.NoError(t, h.Commit(tx))
	// The pooled write spreads 2 tokens over 4 shards: none is full.
	res, err = l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted, "only the fixed window, a full window later")
	require.Len(t, h.Rows(t, sharded, "k"), 4)

	// MaxBatches bounds a call, and the next call goes on from there.
	clk.Advance(time.Hour)
	res, err = l.Prune(ctx, &txlimit.PruneOptions{BatchSize: 1, MaxBatches: 1})
	require.NoError(t, err)
	require.False(t, res.Complete)
	require.Equal(t, 1, res.Batches)
	total := res
	for !res.Complete {
		res, err = l.Prune(ctx, &txlimit.PruneOptions{BatchSize: 1, MaxBatches: 1})
		require.NoError(t, err)
		total.Deleted += res.Deleted
		total.Unknown += res.Unknown
	}
	require.Equal(t, 4, total.Deleted, "the four shards of the sharded key, together")
	require.Equal(t, 1, total.Unknown)
	require.Empty(t, h.Rows(t, sharded, "k"))

	// PruneOptions.Limits gives the unknown name its config.
	res, err = l.Prune(ctx, &txlimit.PruneOptions{Limits: map[string]txlimit.Config{unknown: unknownCfg}})
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Deleted: 1, Keys: 1, Batches: 2, Complete: true}, res)

	// Rows beyond the config's shards (an older config with more) go with
	// their key.
	wide := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 8})
	require.True(t, limitTx(sharded, "wide", txlimit.Count(8), wide).OK)
	require.Len(t, h.Rows(t, sharded, "wide"), 8)
	clk.Advance(time.Hour)
	res, err = l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 8, res.Deleted)

	// A clock behind a row's time: the row is not the same as no row.
	require.True(t, limitTx(tb, "late", txlimit.Count(0)).OK)
	clk.Advance(-time.Minute)
	res, err = l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted)
	clk.Advance(time.Minute)
	res, err = l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted)

	for _, bad := range []*txlimit.PruneOptions{
		{BatchSize: -1},
		{MaxBatches: -1},
		{Limits: map[string]txlimit.Config{"x": {Kind: txlimit.TokenBucket}}},
	} {
		_, err := l.Prune(ctx, bad)
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
	}
}
