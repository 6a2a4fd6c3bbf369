package algo

import "math"

// The SlidingWindow state is counts (docs/windows.md): Value is the count of
// the current window, which starts at TS (below zero, unused Rate saved
// up), Prev the count the previous window hands over. The tokens are
//
//	Rate - Value - Prev·(TS+Period-now)/Period
//
// and Value never goes below low = Rate - Capacity (the count of a full
// window), so they never exceed Capacity.

// low returns the count of a full window: Rate - Capacity.
func (c Config) low() float64 { return c.Rate - c.Capacity }

// projectSliding is Project for a SlidingWindow.
func projectSliding(c Config, s State, now int64) State {
	count, prev := s.Value, s.Prev
	if low := c.low(); count < low {
		// More than Capacity would be there by the end of the window (a
		// row written under a larger Capacity or a lower Rate): the count
		// rises to low, and the surplus comes off what Prev holds back.
		prev = math.Max(0, prev-(low-count))
		count = low
	}
	elapsed := now - s.TS
	if elapsed < c.Period {
		return State{Value: count, TS: s.TS, Prev: prev}
	}
	// Each window that ends passes its count on, less Rate (never below
	// low); the last one that ended is the new Prev: what it passed on is
	// the difference.
	k := elapsed / c.Period
	before := math.Max(count-c.Rate*float64(k-1), c.low())
	after := math.Max(count-c.Rate*float64(k), c.low())
	return State{Value: after, TS: s.TS + k*c.Period, Prev: before - after}
}

// slidingTokens returns the tokens of a SlidingWindow state p that is
// projected to at (at within p's window, or before its start, where the
// previous window still counts in full).
func slidingTokens(c Config, p State, at int64) float64 {
	return c.Rate - p.Value - p.Prev*weight(c, p.TS, at)
}

// weight returns the part of the previous window that a sliding window
// ending at at still covers, for the window starting at ts: 1 at ts, falling
// evenly to 0 at ts+Period.
func weight(c Config, ts, at int64) float64 {
	rest := min(ts+c.Period-at, c.Period)
	return float64(rest) / float64(c.Period)
}

// slidingPool is a SlidingWindow's shards projected to the call's instant
// and merged into one window.
type slidingPool struct {
	tokens float64 // the sum of the shards' tokens at at
	count  float64 // the sum of their counts
	// prev is the Prev that, on the window starting at ts, holds back as
	// much at at as the shards' Prevs do together.
	prev float64
	ts   int64 // the latest projected window start: what a write stamps
	at   int64 // the call's instant (see Pooled)
}

// poolSliding projects each shard to the call's instant and merges them:
// shards stamped by the same write share a window, and their counts and
// Prevs add up. A shard whose window started earlier (after a config
// change) is moved to the latest window, where what its Prev still holds
// back is given back more slowly: never more, at any instant, than it would
// have.
func poolSliding(c Config, states []State, now int64) slidingPool {
	at := instant(states, now)
	projected := make([]State, len(states))
	p := slidingPool{ts: math.MinInt64, at: at}
	for i, s := range states {
		projected[i] = projectSliding(c, s, at)
		p.ts = max(p.ts, projected[i].TS)
	}
	for _, s := range projected {
		p.tokens += slidingTokens(c, s, at)
		p.count += s.Value
		if s.TS == p.ts {
			p.prev += s.Prev
		} else {
			p.prev += s.Prev * weight(c, s.TS, at) / weight(c, p.ts, at)
		}
	}
	return p
}

// with returns n shards of c holding the pooled count and p's prev, spread
// evenly and stamped p.ts. A count below the n shards' low (a credit past
// the window's count, or a reshard under a lower Capacity) stops at low,
// and the rest comes off what prev holds back at the call's instant.
func (p slidingPool) with(c Config, n int, count float64) []State {
	nf := float64(n)
	prev := p.prev
	if low := c.low() * nf; count < low {
		w := weight(c, p.ts, p.at)
		held := math.Max(0, p.prev*w-(low-count))
		prev = held / w
		count = low
	}
	out := make([]State, n)
	for i := range out {
		out[i] = State{Value: count / nf, TS: p.ts, Prev: prev / nf}
	}
	return out
}

// take returns the shards after count is taken. A plain grant whose
// shortfall the tolerance forgave leaves exactly no tokens, never fewer.
func (p slidingPool) take(c Config, n int, count float64, plain bool) []State {
	if plain && p.tokens-count < 0 {
		return p.with(c, n, p.count+p.tokens)
	}
	return p.with(c, n, p.count+count)
}

// slidingUntil is timeUntil for a SlidingWindow: the least wait after which
// the pooled tokens reach target under the test TakeShards grants by. The
// tokens only grow while nothing is taken (within a window the previous
// count weighs less every microsecond, and a new window starts with what
// the last one ended with), so the wait is found by bisection over whole
// microseconds: granted at now+wait, denied a microsecond before, exactly.
func slidingUntil(c Config, states []State, now int64, target float64) int64 {
	tol := tolerance(c) * float64(len(states))
	fits := func(wait int64) bool { return Pooled(c, states, now+wait)-target >= -tol }
	if fits(0) {
		return 0
	}
	// Every shard is full (target is at most the pooled Capacity) once its
	// count has come down to low, window by window, and one more window
	// has passed for Prev to fall to 0.
	at := instant(states, now)
	var full float64
	for _, s := range states {
		p := projectSliding(c, s, at)
		windows := math.Ceil((p.Value-c.low())/c.Rate) + 1
		full = math.Max(full, float64(p.TS-now)+float64(c.Period)*(windows+1))
	}
	hi := MaxWait
	if full < float64(MaxWait) {
		hi = int64(full)
	}
	if !fits(hi) {
		// Only when hi is MaxWait: the tokens come later than that (or a
		// NaN never comes).
		return MaxWait
	}
	lo := int64(0) // !fits(lo) && fits(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}
