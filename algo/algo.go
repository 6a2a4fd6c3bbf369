// Package algo is the arithmetic of txlimit: a limit's stored state, its
// configuration, the current instant and a requested count go in; the new
// state and the decision come out. Nothing here does I/O or reads a clock, so
// every rule of the library can be tested with fixed instants.
//
// All instants are microseconds since the Unix epoch and all durations are
// microseconds: the stores keep time at that precision (PostgreSQL timestamptz,
// SQLite INTEGER), so doing the arithmetic at the same precision means a value
// computed here and a value read back from the database agree exactly.
//
// The functions take and return values; none of them mutates its arguments.
package algo

import (
	"cmp"
	"math"
	"slices"
)

// Kind selects the refill rule.
type Kind uint8

const (
	// TokenBucket refills continuously at Rate/Period tokens per microsecond.
	TokenBucket Kind = iota + 1
	// FixedWindow grants Rate tokens at the start of each window of Period,
	// or of each calendar unit (Config.Calendar).
	FixedWindow
	// SlidingWindow admits at most Rate in a window of Period that slides
	// with the clock, by the sliding window counter with an exact weight
	// (txlimit.SlidingWindow); its state is counts (sliding.go). Worst case:
	// with Capacity b and Rate r per Period p, any span of length L
	// (reservations aside) admits at most
	//
	//	b + min(r, b)·(L - 1µs)/p
	//
	// tokens, just under 2·Rate for L = p and the default b = r
	// (docs/windows.md).
	SlidingWindow
)

// Config is the configuration of one bucket (one shard of a limit). The
// caller has validated it: Rate > 0, Period > 0, Capacity > 0,
// MaxReserved >= 0, all finite.
type Config struct {
	Kind        Kind
	Rate        float64 // tokens per Period
	Period      int64   // microseconds
	Capacity    float64 // the most tokens the bucket holds
	MaxReserved float64 // how far below zero a reservation may go; 0 = no cap
	// Calendar, when its Unit is set, makes a FixedWindow's windows
	// calendar units (Rate per unit, Capacity as for any FixedWindow);
	// Period is then ignored. Other kinds ignore it.
	Calendar Calendar
}

// State is the stored state of one bucket. Value may be negative while
// reservations are outstanding. TS is the time of the last update for a token
// bucket and the start of the current window for a fixed window.
type State struct {
	Value float64
	TS    int64
	// Prev is a third stored number that only a SlidingWindow uses. Every
	// other kind ignores it and writes 0, so a row stored before the
	// column existed (0) reads the same.
	Prev float64
}

// Decision is the outcome of Take.
type Decision struct {
	// OK reports whether the tokens were granted. A denied Take leaves the
	// state as it was.
	OK bool
	// RetryAfter is, for a denial, the time until the whole count fits; for
	// a granted reservation, the time until the reserved tokens exist. It
	// is 0 for an ordinary grant and never more than MaxWait: a denial whose
	// wait is longer (or cannot be computed) says MaxWait.
	RetryAfter int64
	// Overflow reports a reservation refused because granting it would need
	// a RetryAfter of MaxWait or more, or a value beyond float64's range.
	// OK is false and the states come back unchanged, but waiting does not
	// help: the caller reports bad input, not a denial.
	Overflow bool
}

// MaxWait is the longest wait, in microseconds, that a Decision reports:
// half the range of time.Duration (2^62 ns, about 146 years), so that a
// caller may add a jitter or a period to it without overflowing.
const MaxWait = int64(1<<62) / 1000

// tolerance absorbs floating-point rounding so that, say, ten refills of 0.1
// tokens are enough for a request of 1. It is far below any count a caller
// can meaningfully ask for.
func tolerance(c Config) float64 {
	return 1e-9 * math.Max(1, c.Capacity)
}

// Full returns a state that is full at every instant: what a missing row
// means. A fixed or sliding window's TS is on the window origin (a calendar
// window's, the start of the window that holds the epoch), so that
// advancing it lands on a window boundary. A sliding window's Value is the
// count of a full window.
func Full(c Config, origin int64) State {
	switch {
	case c.calendar():
		_, start := c.Calendar.window(0)
		return State{Value: c.Capacity, TS: start}
	case c.Kind == SlidingWindow:
		return State{Value: c.low(), TS: floorMod(origin, c.Period)}
	case c.Kind == FixedWindow:
		return State{Value: c.Capacity, TS: floorMod(origin, c.Period)}
	}
	return State{Value: c.Capacity}
}

// Project advances s to now without consuming anything. Time running
// backwards adds nothing and never moves TS back, so no stretch of time is
// credited twice. The value is capped at Capacity even when no time has
// passed (a row written under a larger capacity). A SlidingWindow's state
// is a count; Pooled gives its tokens.
func Project(c Config, s State, now int64) State {
	switch {
	case c.Kind == SlidingWindow:
		return projectSliding(c, s, now)
	case c.calendar():
		return projectCalendar(c, s, now)
	}
	elapsed := now - s.TS
	if elapsed <= 0 {
		return State{Value: math.Min(s.Value, c.Capacity), TS: s.TS}
	}
	switch c.Kind {
	case FixedWindow:
		windows := elapsed / c.Period
		if windows == 0 {
			return State{Value: math.Min(s.Value, c.Capacity), TS: s.TS}
		}
		v := s.Value + c.Rate*float64(windows)
		return State{Value: math.Min(v, c.Capacity), TS: s.TS + windows*c.Period}
	default:
		v := s.Value + float64(elapsed)*c.Rate/float64(c.Period)
		return State{Value: math.Min(v, c.Capacity), TS: now}
	}
}

// Take consumes count tokens from one bucket at now: TakeShards with a
// single shard.
func Take(c Config, s State, now int64, count float64, reserve bool) (State, Decision) {
	next, d := TakeShards(c, []State{s}, now, count, reserve)
	return next[0], d
}

// TakeShards consumes count tokens from a limit split into len(states)
// shards, each configured by c (one shard's share). The request fits when
// the shards pool count (see Pooled); when it does not and reserve is set,
// it is granted as a reservation unless the debt would exceed the pooled
// MaxReserved (or overflow). A grant spreads what is left evenly over the
// shards, all stamped with the call's instant, so that a reservation's
// RetryAfter is exactly that of one unsharded bucket. A denial returns the
// states unchanged (the same slice).
func TakeShards(c Config, states []State, now int64, count float64, reserve bool) ([]State, Decision) {
	n := float64(len(states))
	var sliding slidingPool
	var pooled float64
	var ts int64
	if c.Kind == SlidingWindow {
		sliding = poolSliding(c, states, now)
		pooled = sliding.tokens
	} else {
		pooled, ts = pool(c, states, now)
	}
	left := pooled - count
	tol := tolerance(c) * n
	// target is what the pooled value must reach for a grant (as a
	// reservation, when reserving). The tests below are written exactly as
	// timeUntil's, so that a denial never gets a RetryAfter of 0 from a
	// rounding difference at the edge of the tolerance.
	target := count
	if reserve {
		target -= c.MaxReserved * n
	}
	switch {
	case left >= -tol:
		if c.Kind == SlidingWindow {
			return sliding.take(c, len(states), count, true), Decision{OK: true}
		}
		return spread(len(states), max(left, 0), ts), Decision{OK: true}
	case reserve && (c.MaxReserved == 0 || pooled-target >= -tol):
		if math.IsInf(left, 0) || math.IsNaN(left) {
			return states, Decision{Overflow: true}
		}
		var next []State
		if c.Kind == SlidingWindow {
			next = sliding.take(c, len(states), count, false)
		} else {
			next = spread(len(states), left, ts)
		}
		ra := RetryAfter(c, next[0], now)
		if ra >= MaxWait {
			return states, Decision{Overflow: true}
		}
		return next, Decision{OK: true, RetryAfter: ra}
	}
	return states, Decision{RetryAfter: timeUntil(c, states, now, target)}
}

// Pooled returns the sum of the shards' values projected to the call's
// instant: now, or the latest shard timestamp when that is later (a clock
// that stepped back, or read before another call stamped a shard). Each
// shard is projected from its own timestamp, so one that was behind gets
// its refill up to that instant.
func Pooled(c Config, states []State, now int64) float64 {
	if c.Kind == SlidingWindow {
		return poolSliding(c, states, now).tokens
	}
	v, _ := pool(c, states, now)
	return v
}

// CreditShards gives count tokens back to a limit split into shards, up to
// the pooled capacity, spread and stamped like a grant. The values stay
// finite for any finite count.
func CreditShards(c Config, states []State, now int64, count float64) []State {
	if c.Kind == SlidingWindow {
		p := poolSliding(c, states, now)
		room := math.Max(c.Capacity*float64(len(states))-p.tokens, 0)
		return p.with(c, len(states), p.count-math.Min(count, room))
	}
	pooled, ts := pool(c, states, now)
	return spread(len(states), math.Min(pooled+count, c.Capacity*float64(len(states))), ts)
}

// Reshard returns the states of a limit written under from (one of
// len(states) shards) as n shards of to, holding the same tokens (and the
// same debt), capped at the n shards' pooled capacity, stamped like a
// grant.
func Reshard(from Config, states []State, to Config, n int, now int64) []State {
	if from.Kind == SlidingWindow {
		// A count is the same whatever the shards (from and to are one
		// limit's config): only the cap of the new shards applies.
		p := poolSliding(from, states, now)
		return p.with(to, n, p.count)
	}
	total, ts := pool(from, states, now)
	return spread(n, math.Min(total, to.Capacity*float64(n)), ts)
}

// pool returns Pooled and the latest projected timestamp: what a grant
// stamps every shard with.
func pool(c Config, states []State, now int64) (float64, int64) {
	at := instant(states, now)
	var sum float64
	ts := int64(math.MinInt64)
	for _, s := range states {
		p := Project(c, s, at)
		sum += p.Value
		ts = max(ts, p.TS)
	}
	return sum, ts
}

// instant is the instant a call at now decides at (see Pooled).
func instant(states []State, now int64) int64 {
	at := now
	for _, s := range states {
		at = max(at, s.TS)
	}
	return at
}

func spread(n int, total float64, ts int64) []State {
	out := make([]State, n)
	for i := range out {
		out[i] = State{Value: total / float64(n), TS: ts}
	}
	return out
}

// RetryAfter returns how long from now until the state p, projected to now,
// holds at least zero tokens. It rounds up, so waiting exactly that long is
// never too early.
func RetryAfter(c Config, p State, now int64) int64 {
	return timeUntil(c, []State{p}, now, 0)
}

// timeUntil returns how long from now until the shards' pooled value reaches
// target, each shard refilling on its own and stopping at its capacity.
// target must not exceed the pooled capacity.
func timeUntil(c Config, states []State, now int64, target float64) int64 {
	if c.Kind == SlidingWindow {
		return slidingUntil(c, states, now, target)
	}
	pooled, ts := pool(c, states, now)
	if pooled-target >= -(tolerance(c) * float64(len(states))) {
		return 0
	}
	// refill is the smallest amount x such that every shard, given x more
	// tokens but never more than its capacity, pools to target.
	gaps := make([]float64, len(states))
	at := instant(states, now)
	for i, s := range states {
		gaps[i] = c.Capacity - Project(c, s, at).Value
	}
	slices.SortFunc(gaps, func(a, b float64) int { return cmp.Compare(b, a) })
	slack := c.Capacity*float64(len(states)) - target
	refill := gaps[0]
	var sum float64
	for k, g := range gaps {
		// With the k+1 largest gaps still open, the missing total at refill
		// x is sum+g - (k+1)x; solve for slack.
		sum += g
		x := (sum - slack) / float64(k+1)
		next := 0.0
		if k+1 < len(gaps) {
			next = gaps[k+1]
		}
		if x >= next {
			refill = x
			break
		}
	}
	switch {
	case c.calendar():
		// As below, in calendar windows.
		windows := math.Max(1, math.Ceil((refill-tolerance(c)/2)/c.Rate))
		return clampDuration(float64(c.Calendar.after(ts, windows) - now))
	case c.Kind == FixedWindow:
		// The pooled value is short by more than the tolerance here, so at
		// least one window is needed. Rounding may leave half a tolerance
		// per shard short (an epsilon relative to refill/Rate instead can
		// exceed the tolerance when Rate is far above Capacity).
		windows := math.Max(1, math.Ceil((refill-tolerance(c)/2)/c.Rate))
		// ts-now in int64: instants beyond 2^53 µs do not survive float64.
		return clampDuration(float64(ts-now) + float64(c.Period)*windows)
	default:
		// Refill resumes only once now passes ts (a clock that stepped back).
		ahead := float64(max(ts-now, 0))
		return clampDuration(ahead + math.Ceil(refill*float64(c.Period)/c.Rate))
	}
}

// WindowStart returns the start of the fixed window that contains now, for
// windows of period aligned to origin.
func WindowStart(origin, period, now int64) int64 {
	return now - floorMod(now-origin, period)
}

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// clampDuration rounds a wait up to whole microseconds within [0,
// MaxWait]; a NaN is MaxWait, so that a denial never says "now".
func clampDuration(us float64) int64 {
	switch {
	case math.IsNaN(us) || us >= float64(MaxWait):
		return MaxWait
	case us <= 0:
		return 0
	}
	return min(int64(math.Ceil(us)), MaxWait)
}
