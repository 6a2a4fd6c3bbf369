package jitter_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/jitter"
)

func TestSpreadBoundsAndDistribution(t *testing.T) {
	t.Parallel()
	const (
		retryAfter = 3 * time.Second
		spread     = 2 * time.Second
		draws      = 10_000
	)
	rng := rand.New(rand.NewPCG(1, 2))
	var deciles [10]int
	distinct := map[time.Duration]bool{}
	for range draws {
		d := jitter.SpreadRand(rng, retryAfter, spread)
		require.GreaterOrEqual(t, d, retryAfter, "never earlier than RetryAfter")
		require.Less(t, d, retryAfter+spread, "the spread is half-open")
		deciles[(d-retryAfter)*10/spread]++
		distinct[d] = true
	}
	// Uniform over [0, spread): each tenth expects 1000 of 10000 draws. The
	// bounds are loose (a binomial with sd ≈ 30 stays within them with
	// overwhelming probability) and only catch a skewed or degenerate draw.
	for i, n := range deciles {
		require.Greater(t, n, 700, "decile %d got %d of %d draws: %v", i, n, draws, deciles)
		require.Less(t, n, 1300, "decile %d got %d of %d draws: %v", i, n, draws, deciles)
	}
	require.Greater(t, len(distinct), draws*9/10, "draws should be nanosecond-grained, not a few values")
}

func TestSpreadRandIsReproducibleWithASeed(t *testing.T) {
	t.Parallel()
	a := rand.New(rand.NewPCG(7, 7))
	b := rand.New(rand.NewPCG(7, 7))
	for range 100 {
		require.Equal(t,
			jitter.SpreadRand(a, time.Second, time.Minute),
			jitter.SpreadRand(b, time.Second, time.Minute))
	}
}

func TestSpreadEdgeCases(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range []time.Duration{0, 1, time.Second, math.MaxInt64} {
		require.Equal(t, d, jitter.Spread(d, 0), "zero spread returns RetryAfter exactly")
		require.Equal(t, d, jitter.SpreadRand(rng, d, 0))
		require.Equal(t, d, jitter.Spread(d, -time.Second), "a negative spread adds nothing")
	}
	// A negative RetryAfter counts as zero.
	require.Equal(t, time.Duration(0), jitter.Spread(-time.Second, 0))
	for range 1000 {
		d := jitter.SpreadRand(rng, -time.Hour, time.Second)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, time.Second)
	}
	// A spread of 1ns can only add 0.
	require.Equal(t, time.Second, jitter.SpreadRand(rng, time.Second, 1))
	// The sum saturates instead of wrapping around to a negative wait.
	for range 1000 {
		d := jitter.SpreadRand(rng, math.MaxInt64-10, math.MaxInt64)
		require.GreaterOrEqual(t, d, time.Duration(math.MaxInt64-10))
	}
	require.Equal(t, time.Duration(math.MaxInt64), jitter.Spread(math.MaxInt64, math.MaxInt64))
}

// The top-level generator serves concurrent callers (run with -race).
func TestSpreadConcurrent(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				d := jitter.Spread(time.Millisecond, time.Millisecond)
				if d < time.Millisecond || d >= 2*time.Millisecond {
					t.Errorf("Spread out of bounds: %v", d)
					return
				}
			}
		})
	}
	wg.Wait()
}
