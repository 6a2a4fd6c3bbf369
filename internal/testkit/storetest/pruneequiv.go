package storetest

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// pruneLimits are the limits of the equivalence test: both kinds, one shard
// and four, a cap on reservations, and windows aligned to a hash or to a
// Start.
func pruneLimits(t *testing.T) map[string]txlimit.Config {
	return map[string]txlimit.Config{
		UniqueName(t, "tb1"): {Kind: txlimit.TokenBucket, Rate: 4, Period: 10 * time.Second, Capacity: 6},
		UniqueName(t, "fw1"): {Kind: txlimit.FixedWindow, Rate: 3, Period: 7 * time.Second, Capacity: 5},
		UniqueName(t, "tb4"): {Kind: txlimit.TokenBucket, Rate: 8, Period: 10 * time.Second, Shards: 4, MaxReserved: 6},
		UniqueName(t, "fw4"): {Kind: txlimit.FixedWindow, Rate: 8, Period: 9 * time.Second, Capacity: 12, Shards: 4, Start: T0.Add(1500 * time.Millisecond)},
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

// applyOp runs op in a transaction of h and commits it.
func applyOp[TTx any](t *testing.T, h Harness[TTx], l *txlimit.Limiter[TTx], op pruneOp) outcome {
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

// runPruneEquivalence runs the same operations on two stores, each with a
// clock of its own advanced by the same steps, pruning one of them after
// every step, and requires every result to be equal: Prune changes no
// decision. pruned must be a store of its own (Prune goes through the
// whole table); plain may be shared, its limits' names being the test's
// own.
//
// The operations are drawn from a seed of the test's name, so that every
// store and exec mode runs a sequence of its own and a failure reruns the
// same one; the seed is logged.
func runPruneEquivalence[TTx any](t *testing.T, plain, pruned Harness[TTx]) {
	ctx := context.Background()
	seed := nameSeed(t.Name())
	t.Logf("seed %d", seed)
	limits := pruneLimits(t)
	ops := randomOps(rand.New(rand.NewPCG(seed, 1)), limits, pruneSteps)
	clkP, clkQ := NewClock(), NewClock()
	lp, err := txlimit.New(plain.Store, limits, &txlimit.Options{Clock: clkP.Now})
	require.NoError(t, err)
	lq, err := txlimit.New(pruned.Store, limits, &txlimit.Options{Clock: clkQ.Now})
	require.NoError(t, err)
	var deleted, visited int
	for i, op := range ops {
		clkP.Advance(op.advance)
		clkQ.Advance(op.advance)
		a := applyOp(t, plain, lp, op)
		b := applyOp(t, pruned, lq, op)
		require.Equal(t, a, b, "step %d: %v", i, op)
		res, err := lq.Prune(ctx, nil)
		require.NoError(t, err)
		require.True(t, res.Complete)
		deleted += res.Deleted
		visited += res.Keys
	}
	t.Logf("pruned %d rows over %d steps (%d key visits)", deleted, len(ops), visited)
	require.Positive(t, deleted, "the sequence must give Prune something to delete")
}

// pruneSteps is the length of the equivalence test's sequence: each step is
// a transaction on each store and a Prune. At 100 steps Prune deleted
// between 150 and 200 rows in each store's and exec mode's run.
const pruneSteps = 100

// nameSeed is a seed drawn from name (FNV-1a).
func nameSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}
