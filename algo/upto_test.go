package algo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTakeUpTo(t *testing.T) {
	tb := tokenBucket(1, sec, 10) // 1 token a second
	cases := []struct {
		name   string
		c      Config
		states []State
		now    int64
		n      float64
		taken  float64
		want   []State // nil for a denial
		ra     int64   // for a denial
	}{
		{name: "all of it", c: tb, states: []State{{Value: 7, TS: t0}}, now: t0, n: 5, taken: 5, want: []State{{Value: 2, TS: t0}}},
		{name: "whole tokens", c: tb, states: []State{{Value: 3.5, TS: t0}}, now: t0, n: 5, taken: 3, want: []State{{Value: 0.5, TS: t0}}},
		// 2.5 fits whole.
		{name: "a fractional n that fits", c: tb, states: []State{{Value: 3.5, TS: t0}}, now: t0, n: 2.5, taken: 2.5, want: []State{{Value: 1, TS: t0}}},
		// 4.5 does not: whole tokens below it, 3.
		{name: "a fractional n that does not", c: tb, states: []State{{Value: 3.5, TS: t0}}, now: t0, n: 4.5, taken: 3, want: []State{{Value: 0.5, TS: t0}}},
		// Within the tolerance, 3 is there.
		{name: "tolerance", c: tb, states: []State{{Value: 2.9999999999, TS: t0}}, now: t0, n: 5, taken: 3, want: []State{{Value: 0, TS: t0}}},
		// Refilled first: 0.5 + 2s.
		{name: "refilled", c: tb, states: []State{{Value: 0.5, TS: t0}}, now: t2, n: 5, taken: 2, want: []State{{Value: 0.5, TS: t2}}},
		// Less than one token: denied until one is there, 0.25s.
		{name: "not one token", c: tb, states: []State{{Value: 0.75, TS: t0}}, now: t0, n: 5, ra: 250 * ms},
		// n below one is the unit: 0.5 or nothing; 0.2 missing, 0.2s.
		{name: "n below one", c: tb, states: []State{{Value: 0.3, TS: t0}}, now: t0, n: 0.5, ra: 200 * ms},
		{name: "n below one fits", c: tb, states: []State{{Value: 0.7, TS: t0}}, now: t0, n: 0.5, taken: 0.5, want: []State{{Value: 0.7 - 0.5, TS: t0}}},
		// In debt: one token once the debt of 2 is paid, 3s.
		{name: "in debt", c: tb, states: []State{{Value: -2, TS: t0}}, now: t0, n: 5, ra: 3 * sec},
		{name: "zero", c: tb, states: []State{{Value: 0, TS: t0}}, now: t0, n: 0, taken: 0, want: []State{{Value: 0, TS: t0}}},
		// Four shards pooling 7.5: 7 of 10, 0.125 left in each.
		{name: "shards", c: tokenBucket(2.5, sec, 2.5), states: []State{{Value: 0, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}, {Value: 2.5, TS: t0}}, now: t0, n: 10, taken: 7,
			want: []State{{Value: 0.125, TS: t0}, {Value: 0.125, TS: t0}, {Value: 0.125, TS: t0}, {Value: 0.125, TS: t0}}},
		// 4 left in the window of 10 a minute, then none until the next.
		{name: "fixed window", c: fixedWindow(10, minute, 10), states: []State{{Value: 4, TS: w0}}, now: w0 + 20*sec, n: 10, taken: 4, want: []State{{Value: 0, TS: w0}}},
		{name: "fixed window, empty", c: fixedWindow(10, minute, 10), states: []State{{Value: 0, TS: w0}}, now: w0 + 20*sec, n: 10, ra: 40 * sec},
		// The boundary case: 10 at 12:00:59; at 12:01:30 half of them
		// weigh, 5 tokens.
		{name: "sliding window", c: slidingWindow(10, minute, 10), states: []State{{Value: 10, TS: clock(12, 0, 0)}}, now: clock(12, 1, 30), n: 10, taken: 5,
			want: []State{{Value: 5, TS: clock(12, 1, 0), Prev: 10}}},
		{name: "sliding window, not one", c: slidingWindow(10, minute, 10), states: []State{{Value: 10, TS: clock(12, 0, 0)}}, now: clock(12, 1, 1), n: 10, ra: 5 * sec},
		// 990 of 1000 used this month: 10 of the 50 asked.
		{name: "calendar", c: calendarWindow(1000, 1000, Calendar{Unit: Month}), states: []State{{Value: 10, TS: utc(2024, 3, 1, 0, 0)}}, now: utc(2024, 3, 20, 0, 0), n: 50, taken: 10,
			want: []State{{Value: 0, TS: utc(2024, 3, 20, 0, 0)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next, d, taken := TakeUpTo(tc.c, tc.states, tc.now, tc.n)
			if tc.want == nil {
				require.Equal(t, Decision{RetryAfter: tc.ra}, d)
				require.Zero(t, taken)
				require.Same(t, &tc.states[0], &next[0], "a denial returns the same slice")
				// One unit fits at RetryAfter, not a microsecond before.
				_, d, taken = TakeUpTo(tc.c, tc.states, tc.now+tc.ra, tc.n)
				require.True(t, d.OK)
				require.GreaterOrEqual(t, taken, min(tc.n, 1))
				_, d, _ = TakeUpTo(tc.c, tc.states, tc.now+tc.ra-1, tc.n)
				require.False(t, d.OK)
				return
			}
			require.Equal(t, Decision{OK: true}, d)
			require.Equal(t, tc.taken, taken)
			require.Len(t, next, len(tc.want))
			for i := range next {
				require.InDelta(t, tc.want[i].Value, next[i].Value, 1e-12)
				require.Equal(t, tc.want[i].TS, next[i].TS)
				require.InDelta(t, tc.want[i].Prev, next[i].Prev, 1e-12)
			}
		})
	}
	require.Equal(t, time.UTC, Calendar{}.location())
}
