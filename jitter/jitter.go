// Package jitter spreads the retries of callers that were told to wait the
// same time. It imports only the standard library, so that any layer of
// txlimit (the stores' RunTx, Limiter.Wait) and any application can use it.
//
// Spread(retryAfter, spread) returns retryAfter plus a duration drawn
// uniformly from [0, spread), at nanosecond grain. It is never shorter than
// retryAfter (a retry before then is denied for certain, so "full jitter"
// would only waste transactions); a negative retryAfter counts as zero and
// a spread <= 0 adds nothing (Spread(d, 0) == d for every d >= 0); a sum
// beyond the largest time.Duration is that, never a negative wait; it never
// panics.
//
// Callers denied on the same (name, key) at about the same moment are told
// the same RetryAfter. If they all come back then, the limit has tokens for
// one of them (a fixed window, for Rate); the others queue on its row lock
// and are denied again, together: a retry storm. Spread over spread, they
// arrive about as fast as the tokens do. Choose spread about n ×
// Period/Rate for a token bucket, n being how many callers may wait on one
// key, and up to Period for a fixed window. A reservation needs none: each
// on a key is due later than the one before it.
package jitter

import (
	"math"
	"math/rand/v2"
	"time"
)

// Spread returns how long a caller that was denied should wait before it
// tries again (see the package documentation), drawing from math/rand/v2's
// top-level generator: it is safe for concurrent use.
func Spread(retryAfter, spread time.Duration) time.Duration {
	return SpreadRand(nil, retryAfter, spread)
}

// SpreadRand is Spread drawing from rng (nil: the top-level generator), for
// a reproducible sequence in tests and simulations. A *rand.Rand is not safe
// for concurrent use; neither, then, is SpreadRand with a shared rng.
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
