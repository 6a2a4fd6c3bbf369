package algo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// noon is 2024-01-15 12:00:00 UTC. With origin 0 the windows of a minute
// start on whole minutes: noon+minute is 12:01:00.
const noon = int64(1_705_320_000_000_000)

// clock returns the instant h:m:s on noon's day (h 12 or later).
func clock(h, m, s int64) int64 { return noon + (h-12)*hour + m*minute + s*sec }

func slidingWindow(rate float64, period int64, capacity float64) Config {
	return Config{Kind: SlidingWindow, Rate: rate, Period: period, Capacity: capacity}
}

// takeEach takes 1 count times at now and requires every take granted.
func takeEach(t *testing.T, c Config, s State, now int64, count int) State {
	t.Helper()
	for i := range count {
		var d Decision
		s, d = Take(c, s, now, 1, false)
		require.Equal(t, Decision{OK: true}, d, "take %d at %d", i+1, now)
	}
	return s
}

// admitted returns how many takes of 1 are granted at now, one after the
// other, from s.
func admitted(c Config, s State, now int64) int {
	n := 0
	for {
		next, d := Take(c, s, now, 1, false)
		if !d.OK {
			return n
		}
		s = next
		n++
	}
}

// requireExact requires that the call is denied at now and now+ra-1 and
// granted at now+ra: RetryAfter is exact to the microsecond.
func requireExact(t *testing.T, c Config, states []State, now int64, count float64, reserve bool, ra int64) {
	t.Helper()
	_, d := TakeShards(c, states, now, count, reserve)
	require.Equal(t, Decision{RetryAfter: ra}, d)
	_, d = TakeShards(c, states, now+ra, count, reserve)
	require.True(t, d.OK, "granted at now+RetryAfter")
	_, d = TakeShards(c, states, now+ra-1, count, reserve)
	require.False(t, d.OK, "denied 1µs before now+RetryAfter")
}

// The boundary case: 10 calls at 12:00:59 under 10 per minute; at
// 12:01:01 a fixed window admits 10 more, the sliding window at most one,
// wherever the window boundaries lie.
func TestSlidingWindowBoundary(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	s := takeEach(t, c, Full(c, 0), clock(12, 0, 59), 10)
	// Window [12:00, 12:01) counts 10. At 12:01:01 they are the previous
	// window's, weighted 59/60: 9.83 of 10, 0.17 left.
	require.Equal(t, State{Value: 10, TS: clock(12, 0, 0)}, s)
	require.Equal(t, 0, admitted(c, s, clock(12, 1, 1)))
	require.InDelta(t, 10-10*59.0/60, Pooled(c, []State{s}, clock(12, 1, 1)), 1e-12)
	// One token is back when the weight is 9/10: at 12:01:06, exactly.
	requireExact(t, c, []State{s}, clock(12, 1, 1), 1, false, 5*sec)
	require.Equal(t, 1, admitted(c, s, clock(12, 1, 6)))

	fw := fixedWindow(10, minute, 10)
	f := takeEach(t, fw, Full(fw, 0), clock(12, 0, 59), 10)
	require.Equal(t, 10, admitted(fw, f, clock(12, 1, 1)))

	// Any phase: the 10 taken at 12:00:59 are given back evenly over the
	// window after theirs, so 2s later at most 10·2/60 of them are back.
	for _, origin := range []int64{0, 1, 500 * ms, 30 * sec, 59 * sec, 59*sec + 500*ms, minute - 1, 60*sec + 700*ms, 13 * sec} {
		s := takeEach(t, c, Full(c, origin), clock(12, 0, 59), 10)
		require.LessOrEqual(t, admitted(c, s, clock(12, 1, 1)), 1, "origin %d", origin)
	}
}

// CakePHP #19287: rounding the weighted count down let a limit of 1 per
// minute reset one second after its call. The weight is exact here.
func TestSlidingWindowNeverResetsEarly(t *testing.T) {
	c := slidingWindow(1, minute, 1)
	s, d := Take(c, Full(c, 0), clock(12, 0, 30), 1, false)
	require.Equal(t, Decision{OK: true}, d)
	for _, now := range []int64{clock(12, 0, 31), clock(12, 0, 59), clock(12, 1, 0), clock(12, 1, 1), clock(12, 1, 30), clock(12, 2, 0) - 1} {
		_, d := Take(c, s, now, 1, false)
		require.False(t, d.OK, "at %d", now)
	}
	// At 12:01 the call is the previous window's, weighted 1 - e/60s: the
	// token is whole again at 12:02:00, 89s after 12:00:31.
	requireExact(t, c, []State{s}, clock(12, 0, 31), 1, false, 89*sec)
	// 1.5 s into the next window, 1/40 of a token is back, not a whole one.
	require.InDelta(t, 1.5/60, Pooled(c, []State{s}, clock(12, 1, 1)+500*ms), 1e-12)
}

// A denied call consumes nothing (mennanov/limiters #110, envoy #185): a
// client retrying every second is not locked out for longer.
func TestSlidingWindowDenialsConsumeNothing(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	s := takeEach(t, c, Full(c, 0), clock(12, 0, 10), 10)
	for now := clock(12, 0, 11); now < clock(12, 1, 6); now += sec {
		next, d := Take(c, s, now, 1, false)
		require.False(t, d.OK, "at %d", now)
		require.Equal(t, s, next, "a denial returns the state unchanged")
	}
	// As if nobody had called: one token at 12:01:06 (weight 9/10).
	s2, d := Take(c, s, clock(12, 1, 6), 1, false)
	require.Equal(t, Decision{OK: true}, d)
	// The window of 12:01 counts 1, the previous one 10.
	require.Equal(t, State{Value: 1, TS: clock(12, 1, 0), Prev: 10}, s2)
}

// The state is a count: a new Rate applies at once, both ways.
func TestSlidingWindowQuotaChangeAppliesAtOnce(t *testing.T) {
	ten := slidingWindow(10, minute, 10)
	s := takeEach(t, ten, Full(ten, 0), clock(12, 0, 10), 10)
	_, d := Take(ten, s, clock(12, 0, 20), 1, false)
	require.False(t, d.OK)

	// Raised to 20: 20 - 10 = 10 more at once.
	twenty := slidingWindow(20, minute, 20)
	require.Equal(t, 10.0, Pooled(twenty, []State{s}, clock(12, 0, 20)))
	require.Equal(t, 10, admitted(twenty, s, clock(12, 0, 20)))

	// Lowered to 5: 5 - 10 = -5 at once. The 5 beyond the new Rate pass
	// to the next window: at 12:01 it counts 5 and weighs 10-5 = 5 from the
	// previous one: 5 - 5 - 5·(1 - e/60s) reaches 0 at 12:02:00. Then it
	// counts 0 and weighs 5: 1 token when 5·(1 - e/60s) = 4, at 12:02:12,
	// 112s after 12:00:20.
	five := slidingWindow(5, minute, 5)
	require.Equal(t, -5.0, Pooled(five, []State{s}, clock(12, 0, 20)))
	requireExact(t, five, []State{s}, clock(12, 0, 20), 1, false, 112*sec)
}

// A reservation beyond the limit is a debt that later windows pay at Rate
// per Period; it is never forgotten when a window ends.
func TestSlidingWindowDebtCarriesOver(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	// 25 reserved at 12:00:00 from full: the window counts 25, -15 tokens.
	// 12:01: counts 15, weighs 10: -15 + 10·e/60s, -5 at 12:02.
	// 12:02: counts 5, weighs 10: -5 + 10·e/60s, 0 at 12:02:30 = 150s.
	s, d := Take(c, Full(c, 0), clock(12, 0, 0), 25, true)
	require.Equal(t, Decision{OK: true, RetryAfter: 150 * sec}, d)
	require.Equal(t, State{Value: 25, TS: clock(12, 0, 0)}, s)
	require.Equal(t, -15.0, Pooled(c, []State{s}, clock(12, 0, 59)))
	require.Equal(t, State{Value: 15, TS: clock(12, 1, 0), Prev: 10}, Project(c, s, clock(12, 1, 30)))
	require.InDelta(t, -10, Pooled(c, []State{s}, clock(12, 1, 30)), 1e-12)
	require.Equal(t, State{Value: 5, TS: clock(12, 2, 0), Prev: 10}, Project(c, s, clock(12, 2, 0)))
	// 12:03: counts 0, weighs 5: 5 + 5·e/60s; 12:04: full again, exactly
	// what a missing row is.
	require.Equal(t, State{Value: 0, TS: clock(12, 3, 0), Prev: 5}, Project(c, s, clock(12, 3, 0)))
	require.Equal(t, Project(c, Full(c, 0), clock(12, 4, 0)), Project(c, s, clock(12, 4, 0)))

	// One token: -5 + 10·e/60s = 1 at e = 36s: 12:02:36, 156s after 12:00.
	requireExact(t, c, []State{s}, clock(12, 0, 0), 1, false, 156*sec)
	// All 10: only when the 12:02 window's 5 weigh nothing, at 12:04.
	requireExact(t, c, []State{s}, clock(12, 0, 0), 10, false, 4*minute)
	// A second reservation queues behind the first: 35 counted, -25.
	// 12:01: 25/10 → -25 + 10e; 12:02: 15/10 → -15 + 10e; 12:03: 5/10 →
	// -5 + 10e, 0 at 12:03:30 = 210s.
	_, d = Take(c, s, clock(12, 0, 0), 10, true)
	require.Equal(t, Decision{OK: true, RetryAfter: 210 * sec}, d)
}

func TestSlidingWindowMaxReserved(t *testing.T) {
	c := slidingWindow(10, minute, 10).withMaxReserved(5)
	s, d := Take(c, Full(c, 0), clock(12, 0, 0), 12, true)
	// -2: 12:01 counts 2, weighs 10: -2 + 10·e/60s = 0 at 12:01:12.
	require.Equal(t, Decision{OK: true, RetryAfter: 72 * sec}, d)
	// 4 more would be -6, deeper than 5: denied until 4 more leave at most
	// -5, that is until -1: at 12:01:06.
	requireExact(t, c, []State{s}, clock(12, 0, 0), 4, true, 66*sec)
}

func TestSlidingWindowCapacity(t *testing.T) {
	t.Run("above rate: unused rate carries over", func(t *testing.T) {
		c := slidingWindow(10, minute, 30)
		full := Full(c, 0)
		require.Equal(t, State{Value: -20, TS: 0}, full, "a full window counts 10 - 30")
		require.Equal(t, 30.0, Pooled(c, []State{full}, noon))
		s, d := Take(c, full, clock(12, 0, 0), 30, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: 10, TS: clock(12, 0, 0)}, s)
		// 12:01 counts 0, weighs 10: 10·e/60s. 12:02 counts -10, weighs
		// 10: 10 + 10·e/60s. 12:03 counts -20, weighs 10: 20 + 10·e/60s.
		// 12:04 is full: counts -20, weighs 0.
		require.InDelta(t, 5, Pooled(c, []State{s}, clock(12, 1, 30)), 1e-12)
		require.InDelta(t, 15, Pooled(c, []State{s}, clock(12, 2, 30)), 1e-12)
		require.InDelta(t, 25, Pooled(c, []State{s}, clock(12, 3, 30)), 1e-12)
		require.Equal(t, State{Value: -20, TS: clock(12, 4, 0)}, Project(c, s, clock(12, 4, 0)))
		// 30 again: at 12:04.
		requireExact(t, c, []State{s}, clock(12, 0, 0), 30, false, 4*minute)
	})
	t.Run("below rate: bursts of Capacity", func(t *testing.T) {
		c := slidingWindow(10, minute, 4)
		require.Equal(t, State{Value: 6}, Full(c, 0))
		s := takeEach(t, c, Full(c, 0), clock(12, 0, 10), 4)
		require.Equal(t, 0, admitted(c, s, clock(12, 0, 10)))
		// 12:01 counts max(10 - 10, 6) = 6 and weighs 10 - 6 = 4:
		// 4·e/60s, one token at 12:01:15.
		require.Equal(t, State{Value: 6, TS: clock(12, 1, 0), Prev: 4}, Project(c, s, clock(12, 1, 0)))
		requireExact(t, c, []State{s}, clock(12, 0, 10), 1, false, 65*sec)
	})
	t.Run("lowered", func(t *testing.T) {
		// A row counting -20 under Capacity 30 read under Capacity 10:
		// the count rises to 0 and the surplus of 20 comes off Prev.
		c := slidingWindow(10, minute, 10)
		require.Equal(t, State{Value: 0, TS: clock(12, 0, 0), Prev: 5}, Project(c, State{Value: -20, TS: clock(12, 0, 0), Prev: 25}, clock(12, 0, 30)))
		require.Equal(t, State{Value: 0, TS: clock(12, 0, 0)}, Project(c, State{Value: -20, TS: clock(12, 0, 0), Prev: 5}, clock(12, 0, 30)))
		require.Equal(t, 10.0, Pooled(c, []State{{Value: -20, TS: clock(12, 0, 0)}}, clock(12, 0, 30)))
	})
}

func TestSlidingWindowShards(t *testing.T) {
	// 10 per minute over 4 shards of 2.5, as the driver splits a limit.
	c := slidingWindow(2.5, minute, 2.5)
	full := []State{Full(c, 0), Full(c, 0), Full(c, 0), Full(c, 0)}

	t.Run("the boundary case", func(t *testing.T) {
		states := full
		for range 10 {
			var d Decision
			states, d = TakeShards(c, states, clock(12, 0, 59), 1, false)
			require.Equal(t, Decision{OK: true}, d)
		}
		for _, s := range states {
			require.Equal(t, State{Value: 2.5, TS: clock(12, 0, 0)}, s)
		}
		_, d := TakeShards(c, states, clock(12, 1, 1), 1, false)
		require.False(t, d.OK)
		requireExact(t, c, states, clock(12, 1, 1), 1, false, 5*sec)
	})

	t.Run("reservation as unsharded", func(t *testing.T) {
		next, d := TakeShards(c, full, clock(12, 0, 0), 25, true)
		require.Equal(t, Decision{OK: true, RetryAfter: 150 * sec}, d)
		for _, s := range next {
			require.Equal(t, State{Value: 6.25, TS: clock(12, 0, 0)}, s)
		}
	})

	t.Run("one shard taken alone", func(t *testing.T) {
		// A store served 2 from shard 0 alone (Take on it): the pool
		// holds 10 - 2 and the shards share one window.
		states := []State{{Value: 2, TS: clock(12, 0, 0)}, Full(c, 0), Full(c, 0), Full(c, 0)}
		require.Equal(t, 8.0, Pooled(c, states, clock(12, 0, 30)))
		next, d := TakeShards(c, states, clock(12, 0, 30), 7, false)
		require.Equal(t, Decision{OK: true}, d)
		for _, s := range next {
			require.Equal(t, State{Value: 2.25, TS: clock(12, 0, 0)}, s)
		}
		// 9 counted at 12:00, given back evenly over 12:01: 1 + 9·e/60s;
		// 4 tokens at 12:01:20.
		requireExact(t, c, next, clock(12, 0, 30), 4, false, 50*sec)
	})

	t.Run("windows that differ", func(t *testing.T) {
		// Rows of two phases (the origin changed): shard 0's window
		// started at 12:00:00 and weighs 2 of its previous one, shard 1's
		// at 12:00:30 weighing 1. At 12:00:45 shard 0 holds back 2·15/60 =
		// 0.5 and shard 1 1·45/60 = 0.75: 2.5·2 - 0.5 - 0.75 = 3.75.
		c := slidingWindow(2.5, minute, 2.5)
		states := []State{{Value: 0, TS: clock(12, 0, 0), Prev: 2}, {Value: 0, TS: clock(12, 0, 30), Prev: 1}}
		now := clock(12, 0, 45)
		require.Equal(t, 3.75, Pooled(c, states, now))
		next, d := TakeShards(c, states, now, 0.75, false)
		require.Equal(t, Decision{OK: true}, d)
		// Merged into the later window, which 45/60 of its previous one
		// still weighs: 0.5 + 0.75 held back is a Prev of 1.25/0.75.
		for _, s := range next {
			require.Equal(t, clock(12, 0, 30), s.TS)
			require.InDelta(t, 0.375, s.Value, 1e-12)
			require.InDelta(t, 1.25/0.75/2, s.Prev, 1e-12)
		}
		require.InDelta(t, 3, Pooled(c, next, now), 1e-12)
		// Never more than the shards would have held on their own.
		for at := now; at < now+3*minute; at += 5 * sec {
			mine := []State{{Value: 0.75, TS: clock(12, 0, 0), Prev: 2}, {Value: 0, TS: clock(12, 0, 30), Prev: 1}}
			require.LessOrEqual(t, Pooled(c, next, at), Pooled(c, mine, at)+1e-12, "at %d", at)
		}
	})
}

func TestSlidingWindowCredit(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	// Refund a reservation: 25 counted, 15 back, 10 counted, 0 tokens.
	s, _ := Take(c, Full(c, 0), clock(12, 0, 0), 25, true)
	require.Equal(t, []State{{Value: 10, TS: clock(12, 0, 0)}}, CreditShards(c, []State{s}, clock(12, 0, 0), 15))
	// Never above Capacity: 10 counted, 30 back leaves a full window.
	require.Equal(t, []State{{Value: 0, TS: clock(12, 0, 0)}}, CreditShards(c, []State{{Value: 10, TS: clock(12, 0, 0)}}, clock(12, 0, 0), 30))
	// Counting 0 and weighing 10 at half the window: 10 - 5 = 5 tokens. 3
	// back cannot lower the count below 0 (a full window's); they come off
	// what the previous window still holds back: 5 - 3 = 2, a Prev of 4.
	got := CreditShards(c, []State{{Value: 0, TS: clock(12, 0, 0), Prev: 10}}, clock(12, 0, 30), 3)
	require.Equal(t, []State{{Value: 0, TS: clock(12, 0, 0), Prev: 4}}, got)
	require.Equal(t, 8.0, Pooled(c, got, clock(12, 0, 30)))
	require.Equal(t, 10.0, Pooled(c, got, clock(12, 1, 0)))
}

func TestSlidingWindowReshard(t *testing.T) {
	one := slidingWindow(10, minute, 10)
	two := slidingWindow(5, minute, 5)
	// Counts are counts whatever the shards: 6 and 4 are 3 and 2 each.
	require.Equal(t, []State{{Value: 3, TS: clock(12, 0, 0), Prev: 2}, {Value: 3, TS: clock(12, 0, 0), Prev: 2}},
		Reshard(one, []State{{Value: 6, TS: clock(12, 0, 0), Prev: 4}}, two, 2, clock(12, 0, 30)))
	// And back, with a debt.
	require.Equal(t, []State{{Value: 30, TS: clock(12, 0, 0)}},
		Reshard(two, []State{{Value: 15, TS: clock(12, 0, 0)}, {Value: 15, TS: clock(12, 0, 0)}}, one, 1, clock(12, 0, 30)))
}

func TestSlidingWindowTimeRunsBackwards(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	// Written in the window of 12:02 by a clock ahead, read at 12:00:30:
	// nothing of the window before it is given back yet.
	s := State{Value: 4, TS: clock(12, 2, 0), Prev: 6}
	require.Equal(t, s, Project(c, s, clock(12, 0, 30)))
	require.Equal(t, 0.0, Pooled(c, []State{s}, clock(12, 0, 30)))
	next, d := Take(c, s, clock(12, 0, 30), 0, false)
	require.Equal(t, Decision{OK: true}, d)
	require.Equal(t, []State{s}, []State{next}, "TS never moves back")
	// The window of 12:02 holds 10 - 4 - 6·(1 - e/60s): one token when 6
	// weighs 5, at 12:02:10, 100s after 12:00:30.
	requireExact(t, c, []State{s}, clock(12, 0, 30), 1, false, 100*sec)
}

// The sliding state of a limit that is full again is exactly a missing
// row's, so Prune may delete it.
func TestSlidingWindowFullAgainIsFull(t *testing.T) {
	c := slidingWindow(3, 10*sec, 5)
	const origin = 7 * sec
	s := Full(c, origin)
	require.Equal(t, State{Value: -2, TS: 7 * sec}, s)
	var d Decision
	s, d = Take(c, s, noon+4*sec, 5, true)
	require.True(t, d.OK)
	// Counts 3 (-2 + 5) in the window of noon-3s; two windows bring it to
	// -2 (low), one more lets Prev fall to 0: full from noon+27s.
	require.NotEqual(t, Project(c, Full(c, origin), noon+17*sec), Project(c, s, noon+17*sec))
	require.Equal(t, Project(c, Full(c, origin), noon+27*sec), Project(c, s, noon+27*sec))
}
