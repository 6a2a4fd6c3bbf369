package txlimit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// pruneLimits are the limits of the equivalence test: both kinds, one shard
// and four, a cap on reservations, and windows aligned to a hash or to a
// Start.
func pruneLimits(t *testing.T) map[string]txlimit.Config {
	return map[string]txlimit.Config{
		uniqueName(t, "tb1"): {Kind: txlimit.TokenBucket, Rate: 4, Period: 10 * time.Second, Capacity: 6},
		uniqueName(t, "fw1"): {Kind: txlimit.FixedWindow, Rate: 3, Period: 7 * time.Second, Capacity: 5},
		uniqueName(t, "tb4"): {Kind: txlimit.TokenBucket, Rate: 8, Period: 10 * time.Second, Shards: 4, MaxReserved: 6},
		uniqueName(t, "fw4"): {Kind: txlimit.FixedWindow, Rate: 8, Period: 9 * time.Second, Capacity: 12, Shards: 4, Start: t0.Add(1500 * time.Millisecond)},
	}
}

// pruneOp is one step of the equivalence test: advance the clock, then one
// call.
type pruneOp struct {
	advance time.Duration
	kind    string // "limit", "limitAll", "credit", "check", "value"
	name    string
	key     string
	count   float64
	reserve bool
	all     []txlimit.Request // for "limitAll"
}

func (op pruneOp) options() []txlimit.Option {
	opts := []txlimit.Option{txlimit.Count(op.count)}
	if op.reserve {
		opts = append(opts, txlimit.Reserve())
	}
	return opts
}

func (op pruneOp) String() string {
	if op.kind == "limitAll" {
		return fmt.Sprintf("+%v limitAll %v", op.advance, op.all)
	}
	return fmt.Sprintf("+%v %s %s/%s count=%v reserve=%v", op.advance, op.kind, op.name, op.key, op.count, op.reserve)
}

// randomOps returns a reproducible sequence of operations on the limits.
// Calls on a sharded limit through LimitTx ask for more than one shard
// holds, or go through LimitAllTx: PostgreSQL's fast path takes a shard at
// random, which would make two runs differ whether or not one is pruned.
func randomOps(rng *rand.Rand, limits map[string]txlimit.Config, n int) []pruneOp {
	names := slices.Sorted(maps.Keys(limits)) // map order is random; the sequence must not be
	keys := []string{"a", "b", "c"}
	counts := []float64{0.5, 1, 1, 2, 3}
	ops := make([]pruneOp, n)
	for i := range ops {
		op := pruneOp{name: names[rng.IntN(len(names))], key: keys[rng.IntN(len(keys))]}
		switch r := rng.IntN(100); {
		case r < 30:
		case r < 70:
			op.advance = time.Duration(rng.IntN(3000)) * time.Millisecond
		case r < 92:
			op.advance = time.Duration(rng.IntN(20000)) * time.Millisecond
		default:
			op.advance = 2 * time.Minute
		}
		cfg := limits[op.name]
		capacity := cfg.Capacity
		if capacity == 0 {
			capacity = cfg.Rate
		}
		op.count = min(counts[rng.IntN(len(counts))], capacity)
		op.reserve = rng.IntN(4) == 0
		switch r := rng.IntN(100); {
		case r < 45:
			op.kind = "limit"
			if cfg.Shards > 1 {
				// Above one shard's capacity: never the fast path.
				op.count = min(capacity, capacity/float64(cfg.Shards)+0.5+float64(rng.IntN(3)))
			}
		case r < 70:
			op.kind = "limitAll"
			op.all = []txlimit.Request{txlimit.Req(op.name, op.key, op.options()...)}
			if other := names[rng.IntN(len(names))]; other != op.name && rng.IntN(2) == 0 {
				op.all = append(op.all, txlimit.Req(other, keys[rng.IntN(len(keys))]))
			}
		case r < 80:
			op.kind = "credit"
		case r < 90:
			op.kind = "check"
		default:
			op.kind = "value"
		}
		ops[i] = op
	}
	return ops
}

// outcome is everything an operation reports, for comparing two runs.
type outcome struct {
	Results []txlimit.Result
	OK      bool
	Retry   time.Duration
	Value   float64
	At      time.Time
}

// apply runs op in a transaction of h and commits it.
func apply[TTx any](t *testing.T, h harness[TTx], l *txlimit.Limiter[TTx], op pruneOp) outcome {
	t.Helper()
	ctx := context.Background()
	tx := h.begin(t)
	var out outcome
	switch op.kind {
	case "limit", "check":
		f := l.LimitTx
		if op.kind == "check" {
			f = l.CheckTx
		}
		res, err := f(ctx, tx, op.name, op.key, op.options()...)
		require.NoError(t, err)
		out.Results, out.OK, out.Retry, out.At = []txlimit.Result{res}, res.OK, res.RetryAfter, res.At
	case "limitAll":
		res, err := l.LimitAllTx(ctx, tx, op.all...)
		require.NoError(t, err)
		out.Results, out.OK, out.Retry, out.At = res.Results, res.OK, res.RetryAfter, res.At
	case "credit":
		require.NoError(t, l.CreditTx(ctx, tx, op.name, op.key, op.count))
	case "value":
		snap, err := l.ValueTx(ctx, tx, op.name, op.key)
		require.NoError(t, err)
		out.Value, out.At = snap.Value, snap.At
	}
	require.NoError(t, h.commit(tx))
	return out
}

// runPruneEquivalence runs the same operations on two fresh stores, pruning
// one of them after every step, and requires every result to be equal. The
// two runs are parallel subtests, each with a clock of its own advanced by
// the same steps: the stores share nothing, and each run is a chain of round
// trips that would otherwise wait for the other's.
func runPruneEquivalence[TTx any](t *testing.T, plain, pruned harness[TTx], seed uint64) {
	ctx := context.Background()
	t.Logf("seed %d", seed)
	limits := pruneLimits(t)
	ops := randomOps(rand.New(rand.NewPCG(seed, 1)), limits, 400)
	var a, b []outcome
	var deleted, keptFull int
	t.Run("runs", func(t *testing.T) {
		t.Run("plain", func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			lp, err := txlimit.New(plain.store, limits, &txlimit.Options{Clock: clk.Now})
			require.NoError(t, err)
			for _, op := range ops {
				clk.Advance(op.advance)
				a = append(a, apply(t, plain, lp, op))
			}
		})
		t.Run("pruned", func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			lq, err := txlimit.New(pruned.store, limits, &txlimit.Options{Clock: clk.Now})
			require.NoError(t, err)
			for _, op := range ops {
				clk.Advance(op.advance)
				b = append(b, apply(t, pruned, lq, op))
				res, err := lq.Prune(ctx, nil)
				require.NoError(t, err)
				require.True(t, res.Complete)
				deleted += res.Deleted
				keptFull += res.Keys
			}
		})
	})
	if t.Failed() {
		t.FailNow() // a run failed: its outcomes are incomplete
	}
	for i, op := range ops {
		require.Equal(t, a[i], b[i], "step %d: %v", i, op)
	}
	t.Logf("pruned %d rows over %d steps (%d key visits)", deleted, len(ops), keptFull)
	require.Positive(t, deleted, "the sequence must give Prune something to delete")
}

func TestPruneChangesNoDecisionPostgres(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			plain := pgHarness(t, testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4))
			pruned := pgHarness(t, testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4))
			runPruneEquivalence(t, plain, pruned, seed)
		})
	}
}

func TestPruneChangesNoDecisionSQLite(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			plain, pruned := sqliteHarness(t, openSQLite(t)), sqliteHarness(t, openSQLite(t))
			runPruneEquivalence(t, plain, pruned, seed)
		})
	}
}

// runPruneBasics is what Prune deletes and what it keeps, on every store.
// Prune goes through the whole table, so h must be a store of its own.
func runPruneBasics[TTx any](t *testing.T, h harness[TTx]) {
	ctx := context.Background()
	tb := uniqueName(t, "tb")
	fw := uniqueName(t, "fw")
	sharded := uniqueName(t, "sharded")
	unknown := uniqueName(t, "unknown")
	limits := map[string]txlimit.Config{
		tb: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		// Windows start at t0: a per-key phase (from the hash of a random
		// name) put a window boundary in the first 6 s once in 600 runs.
		fw:      {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Start: t0},
		sharded: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4},
	}
	unknownCfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}
	clk := newClock()
	l, err := txlimit.New(h.store, limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	limitTx := func(name, key string, opts ...txlimit.Option) txlimit.Result {
		t.Helper()
		tx := h.begin(t)
		res, err := l.LimitTx(ctx, tx, name, key, opts...)
		require.NoError(t, err)
		require.NoError(t, h.commit(tx))
		return res
	}

	for i := range 5 {
		require.True(t, limitTx(tb, fmt.Sprint("k", i)).OK)
	}
	require.True(t, limitTx(fw, "k").OK)
	require.True(t, limitTx(sharded, "k", txlimit.Count(8)).OK) // all 4 shards empty
	require.True(t, limitTx(unknown, "k", txlimit.WithConfig(unknownCfg)).OK)

	// Nothing has refilled yet.
	res, err := l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Keys: 8, Unknown: 1, Batches: 1, Complete: true}, res)

	// 6s later the token buckets of 10/min have their token back; the
	// sharded limit has 0.8 of its 8, the fixed window waits for its next
	// window.
	clk.Advance(6 * time.Second)
	res, err = l.Prune(ctx, &txlimit.PruneOptions{BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Deleted: 5, Keys: 8, Unknown: 1, Batches: 5, Complete: true}, res, "4 full batches, then one that finds the end")
	for i := range 5 {
		require.Empty(t, h.rows(t, tb, fmt.Sprint("k", i)))
	}
	require.Len(t, h.rows(t, fw, "k"), 1)
	require.Len(t, h.rows(t, sharded, "k"), 4)
	require.Len(t, h.rows(t, unknown, "k"), 1, "a name without a config is left alone")

	// One shard full and three not: the key keeps all four rows.
	clk.Advance(time.Hour)
	tx := h.begin(t)
	require.NoError(t, l.CreditTx(ctx, tx, sharded, "k", 8)) // full
	_, err = l.LimitTx(ctx, tx, sharded, "k", txlimit.Count(6))
	require.NoError(t, err)
	require.NoError(t, h.commit(tx))
	// The pooled write spreads 2 tokens over 4 shards: none is full.
	res, err = l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted, "only the fixed window, a full window later")
	require.Len(t, h.rows(t, sharded, "k"), 4)

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
	require.Empty(t, h.rows(t, sharded, "k"))

	// PruneOptions.Limits gives the unknown name its config.
	res, err = l.Prune(ctx, &txlimit.PruneOptions{Limits: map[string]txlimit.Config{unknown: unknownCfg}})
	require.NoError(t, err)
	require.Equal(t, txlimit.PruneResult{Deleted: 1, Keys: 1, Batches: 1, Complete: true}, res)

	// Rows beyond the config's shards (an older config with more) go with
	// their key.
	wide := txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 8})
	require.True(t, limitTx(sharded, "wide", txlimit.Count(8), wide).OK)
	require.Len(t, h.rows(t, sharded, "wide"), 8)
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
		require.ErrorIs(t, err, txlimit.ErrInvalid)
	}
}

// lockTimeoutPool is a pool on schema whose every statement gives up after
// 100ms of waiting for a lock, with SQLSTATE 55P03: a Prune on it that
// waited for live traffic would fail.
func lockTimeoutPool(t *testing.T, schema string) *pgxpool.Pool {
	return testdb.PoolParams(t, schema, pgx.QueryExecModeCacheStatement, 2, map[string]string{"lock_timeout": "100ms"})
}

// Prune passes over the rows other transactions hold instead of waiting for
// them, and deletes none of a key whose rows it does not all hold.
func TestPrunePostgresNeverWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8)
	h := pgHarness(t, pool)
	one, sharded := uniqueName(t, "one"), uniqueName(t, "sharded")
	limits := map[string]txlimit.Config{
		one:     {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		sharded: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4},
	}
	clk := newClock()
	live, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	pruner, err := txlimit.New(pgstore.New(lockTimeoutPool(t, schema)), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	for _, k := range []string{"busy", "idle"} {
		_, err := live.Limit(ctx, one, k)
		require.NoError(t, err)
		_, err = live.Limit(ctx, sharded, k, txlimit.Count(8))
		require.NoError(t, err)
	}
	clk.Advance(time.Hour) // everything is full again

	// Live traffic holds the row of one/busy, and one shard of
	// sharded/busy (a count one shard holds takes the fast path).
	tx := h.begin(t)
	res, err := live.LimitTx(ctx, tx, one, "busy")
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = live.LimitTx(ctx, tx, sharded, "busy")
	require.NoError(t, err)
	require.True(t, res.OK)
	var held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM txlimit AS t WHERE name = $1 AND key = 'busy'
		AND NOT EXISTS (SELECT FROM txlimit AS u WHERE u.name = t.name AND u.key = t.key AND u.shard = t.shard FOR UPDATE SKIP LOCKED)`,
		sharded).Scan(&held))
	require.Equal(t, 1, held, "the fast path holds one shard")

	pruned, err := pruner.Prune(ctx, nil)
	require.NoError(t, err, "Prune must not wait for the held rows (a wait would hit lock_timeout)")
	require.Equal(t, 5, pruned.Deleted, "one/idle and the 4 shards of sharded/idle")
	require.Len(t, h.rows(t, one, "busy"), 1)
	require.Len(t, h.rows(t, sharded, "busy"), 4, "no shard of a key in use is deleted")
	require.Empty(t, h.rows(t, one, "idle"))
	require.Empty(t, h.rows(t, sharded, "idle"))

	h.rollback(tx)
	pruned, err = pruner.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 5, pruned.Deleted)
}

// Prune running in a loop beside live traffic on the same hot keys neither
// blocks it nor changes what it admits.
func TestPruneBesideTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 12)
	h := pgHarness(t, pool)
	name := uniqueName(t, "hot")
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 20, Period: time.Hour, Shards: 4}}
	clk := newClock()
	live, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	pruner, err := txlimit.New(pgstore.New(lockTimeoutPool(t, schema)), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	// Many keys used once long ago: full again, prunable.
	for i := range 50 {
		_, err := live.Limit(ctx, name, fmt.Sprint("old", i))
		require.NoError(t, err)
	}
	clk.Advance(time.Hour)

	stop := make(chan struct{})
	var pruneErr error
	var deleted int
	var pruneWG sync.WaitGroup
	pruneWG.Add(1)
	go func() {
		defer pruneWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := pruner.Prune(ctx, &txlimit.PruneOptions{BatchSize: 7})
			if err != nil {
				pruneErr = err
				return
			}
			deleted += res.Deleted
		}
	}()
	const workers, callsEach = 10, 6
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*callsEach)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range callsEach {
				tx := h.begin(t)
				res, err := live.LimitTx(ctx, tx, name, "hot")
				if err == nil {
					err = h.commit(tx)
				} else {
					h.rollback(tx)
				}
				if err != nil {
					errs <- err
				} else if res.OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	pruneWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(pruneErr, &pgErr) {
		t.Fatalf("Prune waited for a lock: %v", pruneErr)
	}
	require.NoError(t, pruneErr)
	require.EqualValues(t, 20, admitted.Load())
	require.Equal(t, 50*4, deleted, "the 4 shards of each old key, and never the hot one")
	require.Len(t, h.rows(t, name, "hot"), 4)
}
