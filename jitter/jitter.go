// Package jitter spreads the retries of callers that were told to wait the
// same time. It imports only the standard library, so that any layer of
// txlimit (the retry loop of pgstore.RunTx and pgsqlstore.RunTx,
// Limiter.Wait) and any application can use it.
//
// Spread(retryAfter, spread) returns retryAfter plus a duration drawn
// uniformly from [0, spread), at nanosecond grain:
//
//   - It is never shorter than retryAfter: a retry before then is denied for
//     certain, so "full jitter" over [0, retryAfter+spread) would only add
//     wasted transactions.
//   - A negative retryAfter counts as zero, and a spread <= 0 adds nothing:
//     Spread(d, 0) == d for every d >= 0.
//   - A sum beyond the largest time.Duration is the largest time.Duration;
//     it never wraps around to a negative wait.
//   - It never panics.
//
// Spread draws from math/rand/v2's top-level generator and is safe for
// concurrent use. SpreadRand draws from a *rand.Rand the caller passes, for a
// reproducible sequence in tests and simulations.
//
// # Why
//
// Callers denied on the same (name, key) at about the same moment are told
// the same RetryAfter, because it is computed from the same state: the time
// until the count fits. If they all come back at that instant, the limit has
// tokens for one of them (for a fixed window, for Rate of them); the others
// queue on the limit's row lock, are denied again with a new, again common,
// RetryAfter, and come back together once more. Every refill then costs a
// transaction per waiting caller: a retry storm. Spreading the retries over
// spread lets them arrive about as fast as the tokens do.
//
// Across keys there is little to spread: a token bucket's keys were drained
// at different moments, and a fixed window without Config.Start begins its
// windows at a phase of its own per (name, key), so the keys of one limit do
// not all reset at the same instant. Jitter is about the retries of one key.
//
// A reservation (Result.Reserved) needs no jitter to avoid a storm: each
// reservation on a key is due later than the one before it (see
// docs/reservations.md for the fixed-window case).
//
// # Choosing spread
//
// About n × Period/Rate for a token bucket, where n is how many callers may
// be waiting on one key: they then return at about the rate tokens come in.
// For a fixed window, up to Period: the waiting callers share the Rate
// tokens of the next window, which stay available until they are taken.
package jitter

import (
	"math"
	"math/rand/v2"
	"time"
)

// Spread returns how long a caller that was denied should wait before it
// tries again: retryAfter plus a duration drawn uniformly from [0, spread),
// using math/rand/v2's top-level generator (safe for concurrent use). The
// package documentation gives the edge cases and how to choose spread.
func Spread(retryAfter, spread time.Duration) time.Duration {
	return SpreadRand(nil, retryAfter, spread)
}

// SpreadRand is Spread drawing from rng, for a reproducible sequence in tests
// and simulations. A nil rng uses math/rand/v2's top-level generator. A
// *rand.Rand is not safe for concurrent use; neither, then, is SpreadRand
// with a shared rng.
func SpreadRand(rng *rand.Rand, retryAfter, spread time.Duration) time.Duration {
	retryAfter = max(retryAfter, 0)
	if spread <= 0 {
		return retryAfter
	}
	var extra time.Duration
	if rng == nil {
		extra = rand.N(spread)
	} else {
		extra = time.Duration(rng.Int64N(int64(spread)))
	}
	if retryAfter > math.MaxInt64-extra {
		return math.MaxInt64
	}
	return retryAfter + extra
}
