package algo

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Durations and instants are int64 microseconds. Every expected number in
// this file is worked out by hand in the comment next to it, never by calling
// the code under test.
const (
	ms     = int64(1_000)
	sec    = int64(1_000_000)
	minute = 60 * sec
	hour   = 60 * minute
)

// Fixed instants, a second apart, as in golang.org/x/time/rate's tests.
const (
	t0 = int64(1_700_000_000_000_000)
	t1 = t0 + 1*sec
	t2 = t0 + 2*sec
	t3 = t0 + 3*sec
	t4 = t0 + 4*sec
	t5 = t0 + 5*sec
	t6 = t0 + 6*sec
	t7 = t0 + 7*sec
	t8 = t0 + 8*sec
	t9 = t0 + 9*sec
)

// w0 is the start of a fixed window; the windows are aligned to it.
// (t0 mod 60s = 20s, but Project takes TS as the window start, so any
// instant works for the fixed-window tests that start from a stored state.)
const w0 = t0

func tokenBucket(rate float64, period int64, capacity float64) Config {
	return Config{Kind: TokenBucket, Rate: rate, Period: period, Capacity: capacity}
}

func fixedWindow(rate float64, period int64, capacity float64) Config {
	return Config{Kind: FixedWindow, Rate: rate, Period: period, Capacity: capacity}
}

func (c Config) withMaxReserved(m float64) Config {
	c.MaxReserved = m
	return c
}

// takeCase is one call of Take and its expected outcome. For a denial, the
// expected state is always the input state.
type takeCase struct {
	name    string
	c       Config
	s       State
	now     int64
	count   float64
	reserve bool
	want    State // ignored for a denial
	ok      bool
	ra      int64
}

func runTakeCases(t *testing.T, cases []takeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, d := Take(tc.c, tc.s, tc.now, tc.count, tc.reserve)
			require.Equal(t, Decision{OK: tc.ok, RetryAfter: tc.ra}, d)
			if !tc.ok {
				require.Equal(t, tc.s, got, "a denial returns the state unchanged")
				if tc.ra > 0 {
					// Waiting exactly RetryAfter is enough; 1µs less is not.
					_, d2 := Take(tc.c, tc.s, tc.now+tc.ra, tc.count, tc.reserve)
					require.True(t, d2.OK, "granted at now+RetryAfter")
					_, d3 := Take(tc.c, tc.s, tc.now+tc.ra-1, tc.count, tc.reserve)
					require.False(t, d3.OK, "denied 1µs before now+RetryAfter")
				}
				return
			}
			require.InDelta(t, tc.want.Value, got.Value, 1e-12)
			require.Equal(t, tc.want.TS, got.TS)
		})
	}
}

func TestTokenBucketCappedRefill(t *testing.T) {
	c := tokenBucket(10, minute, 10)
	cases := []struct {
		name string
		s    State
		now  int64
		want State
	}{
		// 3 + 1h * 10/min = 603 → capped at 10.
		{"one hour idle", State{Value: 3, TS: t0}, t0 + hour, State{Value: 10, TS: t0 + hour}},
		// 3 + 42s * 10/60s = 3 + 7 = 10 exactly.
		{"just full", State{Value: 3, TS: t0}, t0 + 42*sec, State{Value: 10, TS: t0 + 42*sec}},
		{"a century idle", State{Value: 0, TS: t0}, t0 + 100*365*24*hour, State{Value: 10, TS: t0 + 100*365*24*hour}},
		{"debt repaid and capped", State{Value: -50, TS: t0}, t0 + hour, State{Value: 10, TS: t0 + hour}},
		{"full stays full", State{Value: 10, TS: t0}, t9, State{Value: 10, TS: t9}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Project(c, tc.s, tc.now))
			got, d := Take(c, tc.s, tc.now, 0, false)
			require.Equal(t, Decision{OK: true}, d)
			require.Equal(t, tc.want, got)
			// Take the whole capacity: exactly 10 were there, not more.
			got, d = Take(c, tc.s, tc.now, 10, false)
			require.Equal(t, Decision{OK: true}, d)
			require.Equal(t, State{Value: 0, TS: tc.now}, got)
		})
	}
}

func TestTokenBucketPartialRefill(t *testing.T) {
	c := tokenBucket(10, minute, 10) // 1 token every 6s
	empty := State{Value: 0, TS: t0}

	// 6s * 10/60s = 1 token exactly; 3s gives half a token.
	require.Equal(t, State{Value: 1, TS: t6}, Project(c, empty, t6))
	require.Equal(t, State{Value: 0.5, TS: t3}, Project(c, empty, t3))
	require.Equal(t, 1.0, Pooled(c, []State{empty}, t6))

	runTakeCases(t, []takeCase{
		{name: "one token after 6s", c: c, s: empty, now: t6, count: 1, ok: true, want: State{Value: 0, TS: t6}},
		{name: "half a token after 3s", c: c, s: empty, now: t3, count: 0.5, ok: true, want: State{Value: 0, TS: t3}},
		// 0.5 tokens at t3; the missing 0.5 take 3s more.
		{name: "one token after 3s", c: c, s: empty, now: t3, count: 1, ra: 3 * sec},
		// 4 tokens, 5 asked: 1 missing, one every 6s.
		{name: "over-consumption", c: c, s: State{Value: 4, TS: t0}, now: t0, count: 5, ra: 6 * sec},
		// Full bucket, all of it: 10 missing at 1/6 per second.
		{name: "empty, whole capacity", c: c, s: empty, now: t0, count: 10, ra: minute},
	})
}

func TestTokenBucketRetryAfterRoundsUp(t *testing.T) {
	runTakeCases(t, []takeCase{
		// 7 tokens/s: one token takes 1e6/7 = 142857.14µs → 142858µs.
		{name: "one seventh of a second", c: tokenBucket(7, sec, 7), s: State{Value: 0, TS: t0}, now: t0, count: 1, ra: 142_858},
		// 3 tokens/s: 1e6/3 = 333333.33µs → 333334µs.
		{name: "one third of a second", c: tokenBucket(3, sec, 3), s: State{Value: 0, TS: t0}, now: t0, count: 1, ra: 333_334},
		// 2 of 3 present, 2.5 asked: 0.5 at 3/s = 166666.67µs → 166667µs.
		{name: "partial deficit", c: tokenBucket(3, sec, 3), s: State{Value: 2, TS: t0}, now: t0, count: 2.5, ra: 166_667},
		// 1/1024 token missing at 1e-6 token/µs: 976.5625µs → 977µs.
		{name: "1/1024 token", c: tokenBucket(1, sec, 1), s: State{Value: 1 - 1.0/1024, TS: t0}, now: t0, count: 1, ra: 977},
	})
}

func TestTokenBucketDenialLeavesStateUnchanged(t *testing.T) {
	c := tokenBucket(10, minute, 10)
	s := State{Value: 2.5, TS: t0}
	// At t3: 2.5 + 0.5 = 3 present, 4 asked, 1 missing = 6s.
	got, d := Take(c, s, t3, 4, false)
	require.Equal(t, Decision{OK: false, RetryAfter: 6 * sec}, d)
	require.Equal(t, s, got, "not projected, not consumed: the input itself")
	// Again at the same instant: same answer (nothing was written).
	got, d = Take(c, got, t3, 4, false)
	require.Equal(t, Decision{OK: false, RetryAfter: 6 * sec}, d)
	require.Equal(t, s, got)
}

func TestCountZero(t *testing.T) {
	tb := tokenBucket(1, sec, 1)
	fw := fixedWindow(10, minute, 10)
	runTakeCases(t, []takeCase{
		{name: "full", c: tokenBucket(5, sec, 5), s: State{Value: 5, TS: t0}, now: t0, ok: true, want: State{Value: 5, TS: t0}},
		{name: "empty", c: tb, s: State{Value: 0, TS: t0}, now: t0, ok: true, want: State{Value: 0, TS: t0}},
		// Count 0 still moves TS forward and refills: 0 + 2s*1/s = 1 (capped).
		{name: "refills", c: tb, s: State{Value: 0, TS: t0}, now: t2, ok: true, want: State{Value: 1, TS: t2}},
		// In debt (reservations outstanding) the value after the take is
		// -2 < 0: denied until the debt is paid, 2 tokens at 1/s.
		{name: "in debt", c: tb, s: State{Value: -2, TS: t0}, now: t0, ra: 2 * sec},
		{name: "in debt, reserve", c: tb, s: State{Value: -2, TS: t0}, now: t0, reserve: true, ok: true, ra: 2 * sec, want: State{Value: -2, TS: t0}},
		{name: "fixed window mid-window", c: fw, s: State{Value: 3, TS: w0}, now: w0 + 30*sec, ok: true, want: State{Value: 3, TS: w0}},
	})
}

func TestFractionalCounts(t *testing.T) {
	c := tokenBucket(1, sec, 1)
	s := State{Value: 1, TS: t0}
	var d Decision
	for _, want := range []float64{0.75, 0.5, 0.25, 0} {
		s, d = Take(c, s, t0, 0.25, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: want, TS: t0}, s)
	}
	// Empty: 0.25 at 1 token/s is 250ms.
	_, d = Take(c, s, t0, 0.25, false)
	require.Equal(t, Decision{RetryAfter: 250 * ms}, d)

	// Ten takes of 0.1 add up to 1 within rounding: all ten are granted.
	s = State{Value: 1, TS: t0}
	for i := range 10 {
		s, d = Take(c, s, t0, 0.1, false)
		require.True(t, d.OK, "take %d of 0.1", i+1)
	}
	require.InDelta(t, 0, s.Value, 1e-9)
	require.GreaterOrEqual(t, s.Value, 0.0)
	// The eleventh waits for 0.1 token: 100ms.
	_, d = Take(c, s, t0, 0.1, false)
	require.Equal(t, Decision{RetryAfter: 100 * ms}, d)

	// Fixed window, fractional rate: 2.5 per minute, 1.25 left, 2 asked:
	// the next window brings 2.5 (capped at 2.5).
	fw := fixedWindow(2.5, minute, 2.5)
	runTakeCases(t, []takeCase{
		{name: "fixed window fraction fits", c: fw, s: State{Value: 1.25, TS: w0}, now: w0 + 10*sec, count: 1.25, ok: true, want: State{Value: 0, TS: w0}},
		{name: "fixed window fraction waits", c: fw, s: State{Value: 1.25, TS: w0}, now: w0 + 10*sec, count: 2, ra: 50 * sec},
	})
}

func TestFixedWindowRefill(t *testing.T) {
	c := fixedWindow(10, minute, 100)
	s := State{Value: 5, TS: w0}
	cases := []struct {
		name string
		now  int64
		want State
	}{
		{"same instant", w0, State{Value: 5, TS: w0}},
		{"mid-window", w0 + 30*sec, State{Value: 5, TS: w0}},
		{"last microsecond of the window", w0 + minute - 1, State{Value: 5, TS: w0}},
		// k = 1: 5 + 10, ts to the next boundary.
		{"next window", w0 + minute, State{Value: 15, TS: w0 + minute}},
		// k = floor(3m59s / 1m) = 3: 5 + 30, ts = w0 + 3m (aligned, not now).
		{"three windows and a bit", w0 + 3*minute + 59*sec, State{Value: 35, TS: w0 + 3*minute}},
		// k = 9: 5 + 90 = 95, still under 100.
		{"nine windows", w0 + 9*minute + 1, State{Value: 95, TS: w0 + 9*minute}},
		// k = 20: 5 + 200 = 205 → capped at 100; ts = w0 + 20m.
		{"capped", w0 + 20*minute + 30*sec, State{Value: 100, TS: w0 + 20*minute}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Project(c, s, tc.now))
			got, d := Take(c, s, tc.now, 1, false)
			require.Equal(t, Decision{OK: true}, d)
			require.Equal(t, State{Value: tc.want.Value - 1, TS: tc.want.TS}, got)
		})
	}

	// Convex's example: 100 per hour, capacity 150. 70 left at the end of
	// a window; the next window holds min(70+100, 150) = 150, not 170.
	convex := fixedWindow(100, hour, 150)
	require.Equal(t, State{Value: 150, TS: w0 + hour}, Project(convex, State{Value: 70, TS: w0}, w0+hour))
	require.Equal(t, State{Value: 70, TS: w0}, Project(convex, State{Value: 70, TS: w0}, w0+hour-1))
	// Two windows later it is still 150.
	require.Equal(t, State{Value: 150, TS: w0 + 2*hour}, Project(convex, State{Value: 70, TS: w0}, w0+2*hour+5*minute))
	// 150 fits in the next window, 150.5 would be over capacity.
	got, d := Take(convex, State{Value: 70, TS: w0}, w0+hour+1, 150, false)
	require.Equal(t, Decision{OK: true}, d)
	require.Equal(t, State{Value: 0, TS: w0 + hour}, got)
}

func TestFixedWindowDenied(t *testing.T) {
	c := fixedWindow(10, minute, 10)
	runTakeCases(t, []takeCase{
		// 3 - 10 = -7: ceil(7/10) = 1 window: w0 + 60s - (w0 + 20s) = 40s.
		{name: "one window", c: c, s: State{Value: 3, TS: w0}, now: w0 + 20*sec, count: 10, ra: 40 * sec},
		// 3 - 3.5 = -0.5: still 1 window.
		{name: "fraction of a window", c: c, s: State{Value: 3, TS: w0}, now: w0 + 20*sec, count: 3.5, ra: 40 * sec},
		// -15 - 10 = -25: ceil(2.5) = 3 windows: w0 + 180s - (w0 + 20s) = 160s.
		{name: "after reservations", c: c, s: State{Value: -15, TS: w0}, now: w0 + 20*sec, count: 10, ra: 160 * sec},
		// -10 - 10 = -20: exactly 2 windows: 120s - 20s = 100s.
		{name: "whole windows", c: c, s: State{Value: -10, TS: w0}, now: w0 + 20*sec, count: 10, ra: 100 * sec},
		// The last microsecond of a window: 1µs to the next.
		{name: "last microsecond", c: c, s: State{Value: 0, TS: w0}, now: w0 + minute - 1, count: 10, ra: 1},
		// State from two windows ago: k = 2 → min(0 + 20, 10) = 10 fits.
		{name: "stale state refilled", c: c, s: State{Value: 0, TS: w0}, now: w0 + 2*minute + 5*sec, count: 10, ok: true, want: State{Value: 0, TS: w0 + 2*minute}},
		// State from one window ago: k = 1 → -8 + 10 = 2; 5 asked, 3
		// missing, next window at w0 + 2m: 2m - 1m5s = 55s.
		{name: "stale state, still short", c: c, s: State{Value: -8, TS: w0}, now: w0 + minute + 5*sec, count: 5, ra: 55 * sec},
	})
}

func TestReservationsStack(t *testing.T) {
	t.Run("token bucket", func(t *testing.T) {
		c := tokenBucket(1, sec, 1)
		s := Full(c, 0)
		// 1 token at t0; each further reservation of 1 waits 1s longer.
		for i, want := range []struct {
			value float64
			ra    int64
		}{{0, 0}, {-1, sec}, {-2, 2 * sec}, {-3, 3 * sec}} {
			var d Decision
			s, d = Take(c, s, t0, 1, true)
			require.Equal(t, Decision{OK: true, RetryAfter: want.ra}, d, "reservation %d", i+1)
			require.Equal(t, State{Value: want.value, TS: t0}, s)
		}
		// 1.5s later: -3 + 1.5 - 1 = -2.5 → 2.5s.
		s, d := Take(c, s, t0+1500*ms, 1, true)
		require.Equal(t, Decision{OK: true, RetryAfter: 2500 * ms}, d)
		require.Equal(t, State{Value: -2.5, TS: t0 + 1500*ms}, s)
		// A plain take is denied while in debt: 2.5 + 1 tokens = 3.5s.
		_, d = Take(c, s, t0+1500*ms, 1, false)
		require.Equal(t, Decision{RetryAfter: 3500 * ms}, d)
		// A count above capacity may be reserved when there is no cap:
		// full bucket, 3 reserved → -2 → 2s.
		s, d = Take(c, Full(c, 0), t0, 3, true)
		require.Equal(t, Decision{OK: true, RetryAfter: 2 * sec}, d)
		require.Equal(t, State{Value: -2, TS: t0}, s)
	})
	t.Run("fixed window", func(t *testing.T) {
		c := fixedWindow(10, minute, 10)
		s := State{Value: 10, TS: w0}
		now := w0 + 20*sec
		for i, want := range []struct {
			count, value float64
			ra           int64
		}{
			{10, 0, 0},
			{5, -5, 40 * sec},    // 1 window: 60s - 20s
			{10, -15, 100 * sec}, // ceil(1.5) = 2 windows: 120s - 20s
			{5, -20, 100 * sec},  // 2 windows exactly
			{0.5, -20.5, 160 * sec},
		} {
			var d Decision
			s, d = Take(c, s, now, want.count, true)
			require.Equal(t, Decision{OK: true, RetryAfter: want.ra}, d, "reservation %d", i+1)
			require.Equal(t, State{Value: want.value, TS: w0}, s)
		}
	})
}

func TestMaxReserved(t *testing.T) {
	c := tokenBucket(1, sec, 1).withMaxReserved(2)
	s := Full(c, 0)
	var d Decision
	for _, want := range []struct {
		value float64
		ra    int64
	}{{0, 0}, {-1, sec}, {-2, 2 * sec}} {
		s, d = Take(c, s, t0, 1, true)
		require.Equal(t, Decision{OK: true, RetryAfter: want.ra}, d)
		require.Equal(t, State{Value: want.value, TS: t0}, s)
	}
	// A fourth would go to -3, deeper than MaxReserved 2: refused, the
	// state comes back as it was (same values). It fits once the value is
	// back to -1, that is after 1s.
	got, d := Take(c, s, t0, 1, true)
	require.Equal(t, Decision{RetryAfter: sec}, d)
	require.Equal(t, State{Value: -2, TS: t0}, got)
	// Half a token deeper than allowed: 0.5 token = 500ms.
	got, d = Take(c, s, t0+500*ms, 1, true)
	require.Equal(t, Decision{RetryAfter: 500 * ms}, d)
	require.Equal(t, State{Value: -2, TS: t0}, got)
	// At t1 it fits: -2 + 1 - 1 = -2, ready after 2s.
	got, d = Take(c, s, t1, 1, true)
	require.Equal(t, Decision{OK: true, RetryAfter: 2 * sec}, d)
	require.Equal(t, State{Value: -2, TS: t1}, got)
	// Count = Capacity + MaxReserved from full: exactly at the cap.
	got, d = Take(c, Full(c, 0), t0, 3, true)
	require.Equal(t, Decision{OK: true, RetryAfter: 2 * sec}, d)
	require.Equal(t, State{Value: -2, TS: t0}, got)

	t.Run("zero means no cap", func(t *testing.T) {
		c := tokenBucket(1, sec, 1)
		s := Full(c, 0)
		var d Decision
		for range 50 {
			s, d = Take(c, s, t0, 1, true)
			require.True(t, d.OK)
		}
		require.Equal(t, State{Value: -49, TS: t0}, s)
		require.Equal(t, 49*sec, d.RetryAfter)
	})

	t.Run("fixed window", func(t *testing.T) {
		c := fixedWindow(10, minute, 10).withMaxReserved(10)
		now := w0 + 20*sec
		s, d := Take(c, State{Value: 0, TS: w0}, now, 10, true) // -10: 1 window, 40s
		require.Equal(t, Decision{OK: true, RetryAfter: 40 * sec}, d)
		got, d := Take(c, s, now, 1, true) // -11 is too deep: wait for -1 → 1 window
		require.Equal(t, Decision{RetryAfter: 40 * sec}, d)
		require.Equal(t, s, got)
	})

	t.Run("sharded", func(t *testing.T) {
		// The unsharded limit above split over 4 shards: each holds a
		// quarter of rate, capacity and MaxReserved.
		c := tokenBucket(0.25, sec, 0.25).withMaxReserved(0.5)
		states := []State{Full(c, 0), Full(c, 0), Full(c, 0), Full(c, 0)}
		var d Decision
		for _, ra := range []int64{0, sec, 2 * sec} {
			states, d = TakeShards(c, states, t0, 1, true)
			require.Equal(t, Decision{OK: true, RetryAfter: ra}, d)
		}
		got, d := TakeShards(c, states, t0, 1, true)
		require.Equal(t, Decision{RetryAfter: sec}, d)
		require.Equal(t, states, got)
		require.Equal(t, -2.0, Pooled(c, states, t0))
	})
}

func TestTimeRunsBackwards(t *testing.T) {
	c := tokenBucket(1, sec, 10)
	start := State{Value: 0, TS: t0}

	t.Run("no refill, ts kept", func(t *testing.T) {
		s := State{Value: 5, TS: t5}
		require.Equal(t, s, Project(c, s, t3))
		got, d := Take(c, s, t3, 2, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: 3, TS: t5}, got, "TS never moves back")
	})

	t.Run("no stretch credited twice", func(t *testing.T) {
		// t5, t3, t6 gives what t5, t6 gives: the time from t3 to t5 is
		// credited once (at t5), and t5..t6 once (at t6).
		var d Decision
		a := start
		for _, now := range []int64{t5, t3, t6} {
			a, d = Take(c, a, now, 0, false)
			require.True(t, d.OK)
		}
		b := start
		for _, now := range []int64{t5, t6} {
			b, d = Take(c, b, now, 0, false)
			require.True(t, d.OK)
		}
		require.Equal(t, State{Value: 6, TS: t6}, a)
		require.Equal(t, b, a)
		// And consuming on the way: 5 at t5, 1 taken at t3, +1 by t6 = 5.
		s, _ := Take(c, start, t5, 0, false)
		s, _ = Take(c, s, t3, 1, false)
		require.Equal(t, State{Value: 4, TS: t5}, s)
		s, _ = Take(c, s, t6, 0, false)
		require.Equal(t, State{Value: 5, TS: t6}, s)
	})

	t.Run("fixed window", func(t *testing.T) {
		fw := fixedWindow(10, minute, 10)
		s := State{Value: 2, TS: w0 + 2*minute} // written by a clock 90s ahead
		require.Equal(t, s, Project(fw, s, w0+30*sec))
		got, d := Take(fw, s, w0+30*sec, 2, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: 0, TS: w0 + 2*minute}, got)
		// Windows are counted from the stored start: the first refill is
		// at w0 + 3m, not at w0 + 1m.
		require.Equal(t, State{Value: 2, TS: w0 + 2*minute}, Project(fw, s, w0+3*minute-1))
		require.Equal(t, State{Value: 10, TS: w0 + 3*minute}, Project(fw, s, w0+3*minute))
	})

	// RetryAfter counts from the stored TS when it is ahead of now: it is
	// never early.
	runTakeCases(t, []takeCase{
		// TS at t5, now t3, 1 token at 1/s: 2s until t5, then 1s.
		{name: "token bucket denial", c: tokenBucket(1, sec, 1), s: State{Value: 0, TS: t5}, now: t3, count: 1, ra: 3 * sec},
		// Half a token there: 2s + 0.5s.
		{name: "token bucket partial", c: tokenBucket(1, sec, 1), s: State{Value: 0.5, TS: t5}, now: t3, count: 1, ra: 2500 * ms},
		{name: "token bucket reservation", c: tokenBucket(1, sec, 1), s: State{Value: 0, TS: t5}, now: t3, count: 1, reserve: true, ok: true, ra: 3 * sec, want: State{Value: -1, TS: t5}},
		// Window stored as starting at w0 + 2m, now w0 + 30s, 5 missing:
		// 1 window from w0 + 2m: w0 + 3m - (w0 + 30s) = 150s.
		{name: "fixed window denial", c: fixedWindow(10, minute, 10), s: State{Value: 0, TS: w0 + 2*minute}, now: w0 + 30*sec, count: 5, ra: 150 * sec},
		{name: "fixed window reservation", c: fixedWindow(10, minute, 10), s: State{Value: 0, TS: w0 + 2*minute}, now: w0 + 30*sec, count: 15, reserve: true, ok: true, ra: 210 * sec, want: State{Value: -15, TS: w0 + 2*minute}},
	})

	t.Run("sharded, one shard ahead", func(t *testing.T) {
		// Two shards of 1 token/s capacity 1; one was written at t2 by a
		// clock ahead. At t1 the other has refilled to 1; the pooled TS is
		// t2, so both shards are written with TS t2 and the time up to t2
		// is not credited again.
		c := tokenBucket(1, sec, 1)
		states := []State{{Value: 0, TS: t0}, {Value: 0, TS: t2}}
		require.Equal(t, 1.0, Pooled(c, states, t1))
		next, d := TakeShards(c, states, t1, 1, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, []State{{Value: 0, TS: t2}, {Value: 0, TS: t2}}, next)
		// Denied at t1 for 2 tokens: wait for t2 (1s), then both shards
		// must fill (1s): 2s.
		_, d = TakeShards(c, states, t1, 2, false)
		require.Equal(t, Decision{RetryAfter: 2 * sec}, d)
		_, d = TakeShards(c, states, t3, 2, false)
		require.True(t, d.OK)
	})
}

func TestFull(t *testing.T) {
	t.Run("token bucket", func(t *testing.T) {
		c := tokenBucket(10, minute, 10)
		full := Full(c, 0)
		require.Equal(t, 10.0, full.Value)
		for _, now := range []int64{t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, 0, -hour} {
			require.Equal(t, 10.0, Project(c, full, now).Value)
			require.Equal(t, 10.0, Pooled(c, []State{full}, now))
		}
		got, d := Take(c, full, t4, 3, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: 7, TS: t4}, got)
	})

	t.Run("fixed window aligned to origin", func(t *testing.T) {
		c := fixedWindow(10, minute, 10)
		// t0 = 28,333,333 minutes + 20s after the epoch, so with origin
		// 12,345µs the window holding t0..t9 starts at
		// 1,699,999,980,000,000 + 12,345 and the next at +60s.
		const origin = 12_345
		const start = int64(1_699_999_980_012_345)
		const next = start + minute
		full := Full(c, origin)
		require.Equal(t, State{Value: 10, TS: 12_345}, full)
		for _, now := range []int64{t0, t1, t2, t3, t4, t5, t6, t7, t8, t9} {
			require.Equal(t, State{Value: 10, TS: start}, Project(c, full, now))
			require.Equal(t, start, WindowStart(origin, minute, now))
		}
		got, d := Take(c, full, t7, 4, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, State{Value: 6, TS: start}, got)
		// The refill comes at the origin-aligned boundary, not 60s after t7.
		require.Equal(t, State{Value: 6, TS: start}, Project(c, got, next-1))
		require.Equal(t, State{Value: 10, TS: next}, Project(c, got, next))
		// Asking for 10 at t7: 4 missing until next.
		_, d = Take(c, got, t7, 10, false)
		require.Equal(t, Decision{RetryAfter: next - t7}, d)
	})

	t.Run("fixed window origins", func(t *testing.T) {
		c := fixedWindow(10, minute, 10)
		cases := []struct {
			name   string
			origin int64
			ts     int64
		}{
			{"zero", 0, 0},
			{"negative", -5, minute - 5},
			// t0 mod 60s = 20s.
			{"t0", t0, 20 * sec},
			{"in the future", t0 + hour + 5, 20*sec + 5},
			{"one period", minute, 0},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				full := Full(c, tc.origin)
				require.Equal(t, State{Value: 10, TS: tc.ts}, full)
				for _, now := range []int64{t0, t5, t9, t0 + hour + 4, t0 + hour + 5} {
					p := Project(c, full, now)
					require.Equal(t, 10.0, p.Value)
					require.Equal(t, WindowStart(tc.origin, minute, now), p.TS)
				}
			})
		}
	})
}

func TestWindowStart(t *testing.T) {
	cases := []struct {
		origin, period, now, want int64
	}{
		{0, 10, 25, 20},
		{5, 10, 25, 25},
		{5, 10, 24, 15},
		{5, 10, 5, 5},
		{5, 10, 4, -5},
		// now - origin = -2 → floor mod 10 = 8 → -7 - 8 = -15.
		{-5, 10, -7, -15},
		{t0, minute, t0 - 1, t0 - minute},
		{t0, minute, t0 + minute, t0 + minute},
		{12_345, minute, t7, 1_699_999_980_012_345},
		{0, 1, t3, t3},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, WindowStart(tc.origin, tc.period, tc.now), "%+v", tc)
	}
}

func TestRetryAfter(t *testing.T) {
	cases := []struct {
		name string
		c    Config
		s    State
		now  int64
		want int64
	}{
		{"token bucket debt", tokenBucket(1, sec, 1), State{Value: -1.5, TS: t0}, t0, 1500 * ms},
		{"token bucket zero", tokenBucket(1, sec, 1), State{Value: 0, TS: t0}, t0, 0},
		{"token bucket positive", tokenBucket(1, sec, 1), State{Value: 0.5, TS: t0}, t0, 0},
		// -1.5 at t0, seen at t1: -0.5 → 0.5s.
		{"token bucket projected", tokenBucket(1, sec, 1), State{Value: -1.5, TS: t0}, t1, 500 * ms},
		{"token bucket ts ahead", tokenBucket(1, sec, 1), State{Value: -1, TS: t4}, t1, 4 * sec},
		// -5 with 10 per window: 1 window from w0, now w0 + 20s.
		{"fixed window debt", fixedWindow(10, minute, 10), State{Value: -5, TS: w0}, w0 + 20*sec, 40 * sec},
		// -25: 3 windows.
		{"fixed window deep debt", fixedWindow(10, minute, 10), State{Value: -25, TS: w0}, w0 + 20*sec, 160 * sec},
		{"fixed window zero", fixedWindow(10, minute, 10), State{Value: 0, TS: w0}, w0 + 20*sec, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, RetryAfter(tc.c, tc.s, tc.now))
		})
	}
}

func TestTakeShardsPooled(t *testing.T) {
	// 10 tokens/s, capacity 10, over 4 shards: 2.5 and 2.5 each.
	c := tokenBucket(2.5, sec, 2.5)
	states := []State{{Value: 0, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}}
	orig := slices.Clone(states)

	t.Run("fits exactly", func(t *testing.T) {
		next, d := TakeShards(c, states, t0, 7.5, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, []State{{Value: 0, TS: t0}, {Value: 0, TS: t0}, {Value: 0, TS: t0}, {Value: 0, TS: t0}}, next)
		require.Equal(t, orig, states, "input not mutated")
	})

	t.Run("just over", func(t *testing.T) {
		next, d := TakeShards(c, states, t0, 7.6, false)
		require.False(t, d.OK)
		require.Same(t, &states[0], &next[0], "a denial returns the same slice")
		require.Equal(t, orig, next)
		// 0.1 missing; only shard 0 refills, at 2.5/s: 40ms.
		require.Equal(t, 40*ms, d.RetryAfter)
		_, d = TakeShards(c, states, t0+40*ms, 7.6, false)
		require.True(t, d.OK)
		// 7.75: 0.25 missing at 2.5/s: 100ms.
		_, d = TakeShards(c, states, t0, 7.75, false)
		require.Equal(t, Decision{RetryAfter: 100 * ms}, d)
	})

	t.Run("grant spreads the rest evenly", func(t *testing.T) {
		s := []State{{Value: 1, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}}
		// 8.5 - 2.5 = 6 → 1.5 each.
		next, d := TakeShards(c, s, t0, 2.5, false)
		require.Equal(t, Decision{OK: true}, d)
		require.Equal(t, []State{{Value: 1.5, TS: t0}, {Value: 1.5, TS: t0}, {Value: 1.5, TS: t0}, {Value: 1.5, TS: t0}}, next)
		// 400ms later: shard 0 gains 1 (→ 2), the others stay capped:
		// 9.5 - 2.5 = 7 → 1.75 each, TS moved to now.
		next, d = TakeShards(c, s, t0+400*ms, 2.5, false)
		require.Equal(t, Decision{OK: true}, d)
		now := t0 + 400*ms
		require.Equal(t, []State{{Value: 1.75, TS: now}, {Value: 1.75, TS: now}, {Value: 1.75, TS: now}, {Value: 1.75, TS: now}}, next)
	})

	t.Run("one shard equals Take", func(t *testing.T) {
		cases := []struct {
			c       Config
			s       State
			now     int64
			count   float64
			reserve bool
		}{
			{tokenBucket(1, sec, 1), State{Value: 1, TS: t0}, t0, 1, false},
			{tokenBucket(1, sec, 1), State{Value: 0, TS: t0}, t0, 1, false},
			{tokenBucket(1, sec, 1), State{Value: 0, TS: t0}, t0, 1, true},
			{tokenBucket(3, sec, 3).withMaxReserved(1), State{Value: -1, TS: t0}, t0, 1, true},
			{tokenBucket(1, sec, 1), State{Value: 0.5, TS: t5}, t3, 1, false},
			{fixedWindow(10, minute, 10), State{Value: 3, TS: w0}, w0 + 20*sec, 10, false},
			{fixedWindow(10, minute, 10), State{Value: 3, TS: w0}, w0 + 20*sec, 10, true},
			{fixedWindow(10, minute, 10), State{Value: 3, TS: w0}, w0 + 3*minute, 10, false},
			{fixedWindow(10, minute, 10), State{Value: 3, TS: w0 + minute}, w0, 2, false},
		}
		for _, tc := range cases {
			one, d1 := Take(tc.c, tc.s, tc.now, tc.count, tc.reserve)
			many, dn := TakeShards(tc.c, []State{tc.s}, tc.now, tc.count, tc.reserve)
			require.Equal(t, []State{one}, many, "%+v", tc)
			require.Equal(t, d1, dn, "%+v", tc)
		}
	})
}

func TestTakeShardsReservationMatchesUnsharded(t *testing.T) {
	// A limit of 3 tokens/s, capacity 3, split over n shards. Reserving 5
	// from full leaves -2 in total: 2/3s = 666,666.67µs → 666,667µs,
	// whatever n.
	for n := 1; n <= 8; n++ {
		nf := float64(n)
		c := tokenBucket(3/nf, sec, 3/nf)
		states := make([]State, n)
		for i := range states {
			states[i] = Full(c, 0)
		}
		next, d := TakeShards(c, states, t0, 5, true)
		require.Equal(t, Decision{OK: true, RetryAfter: 666_667}, d, "%d shards", n)
		require.InDelta(t, -2, Pooled(c, next, t0), 1e-12)
		for _, s := range next {
			require.InDelta(t, -2/nf, s.Value, 1e-12)
		}
		// At the RetryAfter, the debt is paid; 1µs earlier it is not.
		require.GreaterOrEqual(t, Pooled(c, next, t0+666_667), 0.0)
		require.Less(t, Pooled(c, next, t0+666_666), 0.0)
	}
	// Fixed window, 12 per minute, capacity 12, over n shards: reserving 30
	// from full at w0 + 20s leaves -18: ceil(18/12) = 2 windows:
	// w0 + 2m - (w0 + 20s) = 100s.
	for _, n := range []int{1, 2, 3, 4, 6} {
		nf := float64(n)
		c := fixedWindow(12/nf, minute, 12/nf)
		states := make([]State, n)
		for i := range states {
			states[i] = State{Value: 12 / nf, TS: w0}
		}
		_, d := TakeShards(c, states, w0+20*sec, 30, true)
		require.Equal(t, Decision{OK: true, RetryAfter: 100 * sec}, d, "%d shards", n)
	}
}

func TestTakeShardsUnbalancedRetryAfter(t *testing.T) {
	// Shards of capacity 1 refilling at 1/s (a limit of 4/s, capacity 4).
	tb := tokenBucket(1, sec, 1)
	// Shards of capacity 1 refilling 0.25 per minute.
	fw := fixedWindow(0.25, minute, 1)
	at := func(values ...float64) []State {
		out := make([]State, len(values))
		for i, v := range values {
			out[i] = State{Value: v, TS: t0}
		}
		return out
	}
	cases := []struct {
		name   string
		c      Config
		states []State
		now    int64
		count  float64
		ra     int64
		early  int64 // an instant before RetryAfter that must be denied
	}{
		// pooled(t) = 1 + 3·min(t, 1) ≥ 3.5 → t = 2.5/3 s = 833,333.33µs.
		{"one full, three empty", tb, at(1, 0, 0, 0), t0, 3.5, 833_334, 833_333},
		// pooled(t) = 2 + 2t ≥ 3.5 → t = 0.75s.
		{"two full, two empty", tb, at(1, 1, 0, 0), t0, 3.5, 750 * ms, 750*ms - 1},
		// pooled(t) = min(0.5 + t, 1) + 3t; past 0.5s it is 1 + 3t ≥ 3.9
		// → t = 2.9/3 s = 966,666.67µs. Spreading the 3.4 missing over 4
		// shards (0.85s) would be early.
		{"capacity binds", tb, at(0.5, 0, 0, 0), t0, 3.9, 966_667, 850 * ms},
		// Everything: the empty shards must fill, 1s.
		{"all of it", tb, at(1, 0, 0, 0), t0, 4, sec, sec - 1},
		// Fixed window: the three empty shards gain 0.25 per window, the
		// full one nothing: 1 + 3·0.25·k ≥ 3.5 → k = 4 (3.33 rounded up),
		// at w0 + 4m: 4m - 20s. Three windows (pooled 3.25) are too few.
		{"fixed window", fw, at(1, 0, 0, 0), w0 + 20*sec, 3.5, 4*minute - 20*sec, 3 * minute},
		{"fixed window, one window", fixedWindow(1, minute, 1), at(1, 0, 0, 0), w0 + 20*sec, 3.5, 40 * sec, 40*sec - 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next, d := TakeShards(tc.c, tc.states, tc.now, tc.count, false)
			require.Equal(t, Decision{RetryAfter: tc.ra}, d)
			require.Equal(t, tc.states, next)
			_, d = TakeShards(tc.c, tc.states, tc.now+tc.ra, tc.count, false)
			require.True(t, d.OK, "granted at now+RetryAfter")
			_, d = TakeShards(tc.c, tc.states, tc.now+tc.early, tc.count, false)
			require.False(t, d.OK, "denied before RetryAfter")
		})
	}
}

func TestCreditShards(t *testing.T) {
	c := tokenBucket(2.5, sec, 2.5)
	at := func(ts int64, values ...float64) []State {
		out := make([]State, len(values))
		for i, v := range values {
			out[i] = State{Value: v, TS: ts}
		}
		return out
	}
	cases := []struct {
		name   string
		states []State
		now    int64
		count  float64
		want   []State
	}{
		{"spread", at(t0, 0, 0, 0, 0), t0, 3, at(t0, 0.75, 0.75, 0.75, 0.75)},
		// 9.5 + 5 → capped at the pooled capacity 10.
		{"capped", at(t0, 2.5, 2.5, 2.5, 2), t0, 5, at(t0, 2.5, 2.5, 2.5, 2.5)},
		{"refund a reservation", at(t0, -1, -1, -1, -1), t0, 2, at(t0, -0.5, -0.5, -0.5, -0.5)},
		// Projected first: 1s at 2.5/s fills every shard; the credit adds
		// nothing above capacity.
		{"projected", at(t0, 0, 0, 0, 0), t1, 1, at(t1, 2.5, 2.5, 2.5, 2.5)},
		{"unbalanced", at(t0, 2.5, 0, 0, 0.5), t0, 1, at(t0, 1, 1, 1, 1)},
		{"zero", at(t0, 1, 1, 1, 1), t0, 0, at(t0, 1, 1, 1, 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.states)
			got := CreditShards(c, tc.states, tc.now, tc.count)
			require.Equal(t, tc.want, got)
			require.Equal(t, orig, tc.states, "input not mutated")
			require.LessOrEqual(t, Pooled(c, got, tc.now), 10.0)
		})
	}
}

func TestPooled(t *testing.T) {
	c := tokenBucket(2.5, sec, 2.5) // 1 token per 400ms per shard
	states := []State{{Value: 0, TS: t0}, {Value: 1, TS: t0}, {Value: -1, TS: t0}, {Value: 2.5, TS: t0}}
	// 0 + 1 - 1 + 2.5.
	require.Equal(t, 2.5, Pooled(c, states, t0))
	// Each +1, capped at 2.5: 1 + 2 + 0 + 2.5.
	require.Equal(t, 5.5, Pooled(c, states, t0+400*ms))
	// Long after: all full.
	require.Equal(t, 10.0, Pooled(c, states, t9))
	// Clock behind every TS: nothing added.
	require.Equal(t, 2.5, Pooled(c, states, t0-sec))

	fw := fixedWindow(1, minute, 2)
	states = []State{{Value: 0, TS: w0}, {Value: 1.5, TS: w0}, {Value: -3, TS: w0}}
	require.Equal(t, -1.5, Pooled(fw, states, w0+59*sec))
	// One window: 1 + 2 (capped) + -2.
	require.Equal(t, 1.0, Pooled(fw, states, w0+minute))
}

// A row written under a larger capacity (the config was changed since) is
// capped at the current capacity, even when no time has passed. Before the
// fix in Project, a call in the same microsecond, the same fixed window, or
// with a clock behind the stored TS spent the old capacity.
func TestValueAboveCapacityIsCapped(t *testing.T) {
	tb := tokenBucket(1, sec, 5)
	fw := fixedWindow(5, minute, 5)
	require.Equal(t, State{Value: 5, TS: t0}, Project(tb, State{Value: 8, TS: t0}, t0))
	require.Equal(t, State{Value: 5, TS: t5}, Project(tb, State{Value: 8, TS: t5}, t3))
	require.Equal(t, State{Value: 5, TS: w0}, Project(fw, State{Value: 8, TS: w0}, w0+30*sec))
	require.Equal(t, 5.0, Pooled(fw, []State{{Value: 8, TS: w0}}, w0+30*sec))
	runTakeCases(t, []takeCase{
		// 5 present (not 8): 4 taken leaves 1.
		{name: "token bucket same instant", c: tb, s: State{Value: 8, TS: t0}, now: t0, count: 4, ok: true, want: State{Value: 1, TS: t0}},
		{name: "token bucket clock behind", c: tb, s: State{Value: 8, TS: t5}, now: t3, count: 4, ok: true, want: State{Value: 1, TS: t5}},
		{name: "fixed window mid-window", c: fw, s: State{Value: 8, TS: w0}, now: w0 + 30*sec, count: 4, ok: true, want: State{Value: 1, TS: w0}},
		// A reservation of 7 leaves -2, not +1: 2s at 1/s.
		{name: "token bucket reservation", c: tb, s: State{Value: 8, TS: t0}, now: t0, count: 7, reserve: true, ok: true, ra: 2 * sec, want: State{Value: -2, TS: t0}},
	})
	require.Equal(t, []State{{Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}}, CreditShards(tokenBucket(1, sec, 2.5), []State{{Value: 4, TS: t0}, {Value: 4, TS: t0}}, t0, 0))
}

// A denial has a RetryAfter > 0 even when the shortfall is barely larger
// than the tolerance. Before the fix, TakeShards and timeUntil compared with
// the tolerance in two different float64 expressions, so a shortfall on the
// edge was denied by one and found sufficient by the other: RetryAfter 0,
// and the retry was denied again.
func TestDenialAtToleranceEdge(t *testing.T) {
	// Capacity 2: tolerance 2e-9. 0.999999998 present, 1 asked: about
	// 2.00000002e-9 missing, just over the tolerance; at 1e-6 token/µs the
	// next microsecond brings it.
	runTakeCases(t, []takeCase{
		{name: "token bucket", c: tokenBucket(1, sec, 2), s: State{Value: 0.999999998, TS: t0}, now: t0, count: 1, ra: 1},
		// Fixed window: the next window, 59s away.
		{name: "fixed window", c: fixedWindow(1e4, minute, 2), s: State{Value: 0.999999998, TS: w0}, now: w0 + sec, count: 1, ra: 59 * sec},
	})
}

// Fixed window with a rate far above the capacity. Before the fix, the
// number of windows was ceil(missing/Rate - 1e-12): a shortfall below
// 1e-12·Rate tokens needed 0 windows (a denial with RetryAfter 0), and a
// shortfall of k windows plus less than 1e-12·Rate tokens got k windows
// (a RetryAfter that was too early).
func TestFixedWindowRateFarAboveCapacity(t *testing.T) {
	runTakeCases(t, []takeCase{
		// Capacity 1 (tolerance 1e-9): 2e-9 missing: one window.
		{name: "tiny shortfall", c: fixedWindow(1e4, minute, 1), s: State{Value: 0.999999998, TS: w0}, now: w0 + sec, count: 1, ra: 59 * sec},
		// 1e6 per window; 1e6 + 5e-7 missing: one window leaves 5e-7 (500
		// tolerances) short, so two windows: w0 + 2m - (w0 + 1s) = 119s.
		{name: "just over one window", c: fixedWindow(1e6, minute, 1), s: State{Value: 1 - 1e6 - 5e-7, TS: w0}, now: w0 + sec, count: 1, ra: 119 * sec},
	})
	// The reservation's RetryAfter too: -1e6 - 5e-7 needs two windows.
	c := fixedWindow(1e6, minute, 1)
	_, d := Take(c, State{Value: 1 - 1e6 - 5e-7, TS: w0}, w0+sec, 1, true)
	require.Equal(t, Decision{OK: true, RetryAfter: 119 * sec}, d)
}

// Instants beyond 2^53 µs (year 2255) do not all fit in a float64. Before the
// fix, the fixed-window RetryAfter was computed as float64(ts) + … -
// float64(now), which rounded to an early RetryAfter (and 0 for a
// reservation one window ahead).
func TestFixedWindowInstantsBeyond2To53(t *testing.T) {
	const ts = int64(9_900_000_000_000_000)
	runTakeCases(t, []takeCase{
		// Next window at ts + 1s: 1s - 500,003µs = 499,997µs.
		{name: "denial", c: fixedWindow(1, sec, 1), s: State{Value: 0, TS: ts}, now: ts + 500_003, count: 1, ra: 499_997},
		// Windows of 1µs: the reserved tokens exist 1µs from now.
		{name: "reservation", c: fixedWindow(2.5, 1, 2.5), s: State{Value: 0, TS: ts + 1}, now: ts + 1, count: 1.5, reserve: true, ok: true, ra: 1, want: State{Value: -1.5, TS: ts + 1}},
	})
}
