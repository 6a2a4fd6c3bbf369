package algo

import "math"

// TakeUpTo takes as many tokens as a limit split into len(states) shards
// holds, up to n, and returns the new states, the decision and how many it
// took (redis_rate's AllowAtMost). It takes n when n fits, as TakeShards
// would; otherwise the most whole tokens that fit (for n = 2.5 with 2.2
// there: 2). It denies only when not even one unit fits (one token, or n
// when n is less than one), as TakeShards(c, states, now, unit, false)
// does. It never reserves. The unit must not exceed the pooled Capacity.
func TakeUpTo(c Config, states []State, now int64, n float64) ([]State, Decision, float64) {
	if next, d := TakeShards(c, states, now, n, false); d.OK {
		return next, d, n
	}
	if n > 1 {
		// What fits, under the tolerance TakeShards grants by, in whole
		// tokens and fewer than n. Rounding the sum may overshoot it by a
		// unit in the last place, which one token less always makes up.
		tol := tolerance(c) * float64(len(states))
		whole := math.Min(math.Floor(Pooled(c, states, now)+tol), math.Ceil(n)-1)
		for try := whole; try >= 1 && try >= whole-1; try-- {
			if next, d := TakeShards(c, states, now, try, false); d.OK {
				return next, d, try
			}
		}
	}
	_, d := TakeShards(c, states, now, math.Min(n, 1), false)
	return states, d, 0
}
