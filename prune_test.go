package txlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// pruneLimits are the limits of the equivalence test: both kinds, one shard
// and four, a cap on reservations, and windows aligned to a hash or to a
// Start.
func pruneLimits(t *testing.T) map[string]txlimit.Config {
	return map[string]txlimit.Config{
		storetest.UniqueName(t, "tb1"): {Kind: txlimit.TokenBucket, Rate: 4, Period: 10 * time.Second, Capacity: 6},
		storetest.UniqueName(t, "fw1"): {Kind: txlimit.FixedWindow, Rate: 3, Period: 7 * time.Second, Capacity: 5},
		storetest.UniqueName(t, "tb4"): {Kind: txlimit.TokenBucket, Rate: 8, Period: 10 * time.Second, Shards: 4, MaxReserved: 6},
		storetest.UniqueName(t, "fw4"): {Kind: txlimit.FixedWindow, Rate: 8, Period: 9 * time.Second, Capacity: 12, Shards: 4, Start: storetest.T0.Add(1500 * time.Millisecond)},
	}
}

// pruneOp is one step of the equivalence test: advance the clock, then one
// call.
type pruneOp struct {
	advance time.Duration
	kind    string // "limit", "limitAll", "credit", "check", "value" (a Check of Count(0): the tokens held)
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
			op.all = []txlimit.Request{txlimit.Request{Name: op.name, Key: op.key, Options: op.options()}}
			if other := names[rng.IntN(len(names))]; other != op.name && rng.IntN(2) == 0 {
				op.all = append(op.all, txlimit.Request{Name: other, Key: keys[rng.IntN(len(keys))]})
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
func apply[TTx any](t *testing.T, h storetest.Harness[TTx], l *txlimit.Limiter[TTx], op pruneOp) outcome {
	t.Helper()
	ctx := context.Background()
	tx := h.Begin(t)
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
		res, err := l.CheckTx(ctx, tx, op.name, op.key, txlimit.Count(0))
		require.NoError(t, err)
		out.Value, out.At = res.Remaining, res.At
	}
	require.NoError(t, h.Commit(tx))
	return out
}

// runPruneEquivalence runs the same operations on two fresh stores, pruning
// one of them after every step, and requires every result to be equal. The
// two runs are parallel subtests, each with a clock of its own advanced by
// the same steps: the stores share nothing, and each run is a chain of round
// trips that would otherwise wait for the other's.
func runPruneEquivalence[TTx any](t *testing.T, plain, pruned storetest.Harness[TTx], seed uint64) {
	ctx := context.Background()
	t.Logf("seed %d", seed)
	limits := pruneLimits(t)
	ops := randomOps(rand.New(rand.NewPCG(seed, 1)), limits, 400)
	var a, b []outcome
	var deleted, keptFull int
	t.Run("runs", func(t *testing.T) {
		t.Run("plain", func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock()
			lp, err := txlimit.New(plain.Store, limits, &txlimit.Options{Clock: clk.Now})
			require.NoError(t, err)
			for _, op := range ops {
				clk.Advance(op.advance)
				a = append(a, apply(t, plain, lp, op))
			}
		})
		t.Run("pruned", func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock()
			lq, err := txlimit.New(pruned.Store, limits, &txlimit.Options{Clock: clk.Now})
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
			newHarness := func() storetest.Harness[pgx.Tx] {
				pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4)
				return testdb.PgxHarness(pool, pgstore.New(pool))
			}
			runPruneEquivalence(t, newHarness(), newHarness(), seed)
		})
	}
}

func TestPruneChangesNoDecisionSQLite(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			newHarness := func() storetest.Harness[*sql.Tx] {
				db := testdb.OpenSQLite(t)
				return testdb.SQLiteHarness(db, sqlitestore.New(db))
			}
			runPruneEquivalence(t, newHarness(), newHarness(), seed)
		})
	}
}
