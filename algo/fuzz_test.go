package algo

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"
)

// The fuzz tests check invariants that must hold for every valid input, not
// exact numbers (those are in algo_test.go). Run them with, for example:
//
//	go test ./algo -run='^$' -fuzz='^FuzzTake$' -fuzztime=60s
//	go test ./algo -run='^$' -fuzz='^FuzzTakeShards$' -fuzztime=60s
//
// Plain `go test` runs only the seeds (f.Add and testdata/fuzz).

// Sane magnitudes: beyond these, float64 no longer resolves the tolerance the
// library works to, and the inputs describe no limit anyone configures.
const (
	maxTokens  = 1e12 // |value|, capacity, rate, count, MaxReserved
	maxPeriod  = int64(1e13)
	maxInstant = int64(1e16)
	// maxDebtRatio bounds how far a value may be from zero relative to the
	// capacity: tolerance is 1e-9*max(1, Capacity), and a float64 of
	// magnitude m is only accurate to about 2.2e-16*m, so a value a million
	// capacities deep is still resolved a thousand times finer than the
	// tolerance.
	maxDebtRatio = 1e6
	// maxRetry bounds the RetryAfter whose exactness is checked: beyond
	// 2^53 µs (285 years) float64 no longer holds every microsecond.
	maxRetry = int64(1) << 53
)

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// fold brings a finite x into [-limit, limit] (keeping its sign and low
// digits), so that the fuzzer's large mutations still make usable inputs.
func fold(x, limit float64) float64 {
	if math.Abs(x) > limit {
		return math.Mod(x, limit)
	}
	return x
}

func foldInt(x, limit int64) int64 {
	if x > limit || x < -limit {
		return x % limit
	}
	return x
}

// fuzzConfig builds a per-shard config from raw fuzz inputs, or reports false
// for one the library would reject (or one outside the sane ranges).
func fuzzConfig(kind uint8, rate float64, period int64, capacity, maxReserved float64) (Config, bool) {
	// Invalid configs are skipped; valid ones too large are folded into range.
	if !finite(rate) || rate <= 0 || !finite(capacity) || capacity <= 0 ||
		!finite(maxReserved) || maxReserved < 0 || period < 1 {
		return Config{}, false
	}
	rate = fold(rate, maxTokens)
	capacity = fold(capacity, maxTokens)
	maxReserved = fold(maxReserved, math.Min(maxTokens, maxDebtRatio*math.Max(1, capacity)))
	period = (period-1)%maxPeriod + 1
	c := Config{Kind: TokenBucket, Rate: rate, Period: period, Capacity: capacity, MaxReserved: maxReserved}
	if kind%2 == 0 {
		c.Kind = FixedWindow
	}
	// A rate so small that RetryAfter overflows any clock, or a capacity
	// that folded to zero, is no limit at all.
	if rate < 1e-9 || capacity <= 0 {
		return c, false
	}
	return c, true
}

// validRequest reports whether count is a request the library would accept
// for n shards of c: the limiter rejects these before calling algo.
func validRequest(c Config, n int, count float64, reserve bool) bool {
	nf := float64(n)
	switch {
	case !finite(count) || count < 0 || count > maxTokens:
		return false
	case count > maxDebtRatio*math.Max(1, c.Capacity):
		return false
	case !reserve && count > c.Capacity*nf:
		return false
	case reserve && c.MaxReserved > 0 && count > (c.Capacity+c.MaxReserved)*nf:
		return false
	}
	return true
}

func validState(c Config, s State) bool {
	return finite(s.Value) && math.Abs(s.Value) <= maxTokens &&
		math.Abs(s.Value) <= maxDebtRatio*math.Max(1, c.Capacity) &&
		s.TS >= -maxInstant && s.TS <= maxInstant
}

func validInstant(t int64) bool { return t >= -maxInstant && t <= maxInstant }

// slop is the error the invariants allow in a pooled sum over states: the
// library's own tolerance plus float64 rounding (1e-13 of the magnitudes
// involved).
func slop(c Config, states []State, count float64) float64 {
	m := math.Max(1, c.Capacity) + count + c.MaxReserved*float64(len(states))
	for _, s := range states {
		m += math.Abs(s.Value)
	}
	return tolerance(c)*float64(len(states)) + 1e-13*m
}

// checkTake runs TakeShards on states and checks every invariant of the
// result. It returns the decision so that callers can add their own checks.
func checkTake(t *testing.T, c Config, states []State, now int64, count float64, reserve bool) ([]State, Decision) {
	t.Helper()
	in := append([]State(nil), states...)
	next, d := TakeShards(c, states, now, count, reserve)
	n := len(states)
	tol := slop(c, states, count)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nconfig=%+v\nstates=%+v\nnow=%d count=%v reserve=%v\nnext=%+v decision=%+v",
			append(args, c, in, now, count, reserve, next, d)...)
	}

	for i := range states {
		if states[i] != in[i] {
			fail("TakeShards mutated its input: shard %d %+v -> %+v", i, in[i], states[i])
		}
	}
	if d.RetryAfter < 0 {
		fail("negative RetryAfter %d", d.RetryAfter)
	}
	if len(next) != n {
		fail("got %d states for %d shards", len(next), n)
	}
	for i, s := range next {
		if !finite(s.Value) {
			fail("shard %d: non-finite value %v", i, s.Value)
		}
		if d.OK && s.Value > c.Capacity+tolerance(c) {
			// (A denial returns the input, which may be above a capacity
			// that has since been lowered.)
			fail("shard %d: value %v above capacity %v", i, s.Value, c.Capacity)
		}
	}

	if d.Overflow {
		// A refused reservation: nothing changes, and granting it would
		// really have needed a wait of MaxWait or more (or a value out of
		// float64's range).
		if d.OK || d.RetryAfter != 0 || !reserve {
			fail("overflow with OK=%v RetryAfter=%d reserve=%v", d.OK, d.RetryAfter, reserve)
		}
		for i := range states {
			if next[i] != in[i] {
				fail("overflow changed shard %d: %+v -> %+v", i, in[i], next[i])
			}
		}
		left := Pooled(c, states, now) - count
		if finite(left) {
			// A token bucket needs -left/(n·Rate) periods; a fixed window
			// at most one period less. Plus the time a stepped-back clock
			// waits before refill resumes.
			ahead := float64(max(instant(states, now)-now, 0))
			need := ahead - left/(float64(n)*c.Rate)*float64(c.Period) + float64(c.Period)
			if need < float64(MaxWait)*(1-1e-9) {
				fail("overflow, but the reservation needs only about %v µs (MaxWait %d)", need, MaxWait)
			}
		}
		return next, d
	}
	if !d.OK {
		// A denial writes nothing: the states come back unchanged.
		for i := range states {
			if next[i] != in[i] {
				fail("denial changed shard %d: %+v -> %+v", i, in[i], next[i])
			}
		}
		if d.RetryAfter <= 0 {
			fail("denied with RetryAfter %d", d.RetryAfter)
		}
		// Waiting exactly RetryAfter is never too early: the same call is
		// granted then (as a reservation, for a reserving call whose debt
		// now fits under MaxReserved).
		if d.RetryAfter < min(maxRetry, MaxWait) {
			later := now + d.RetryAfter
			_, d2 := TakeShards(c, states, later, count, reserve)
			// (A reservation whose debt then needs MaxWait or more to
			// repay is refused at that point: waiting was enough for the
			// count to fit under MaxReserved.)
			if !d2.OK && !d2.Overflow {
				fail("denied with RetryAfter %d, but denied again at now+RetryAfter (RetryAfter %d); pooled(now)=%v pooled(later)=%v",
					d.RetryAfter, d2.RetryAfter, Pooled(c, states, now), Pooled(c, states, later))
			}
			checkNotLate(t, c, states, now, count, reserve, d.RetryAfter)
		}
		return next, d
	}

	// A grant.
	before := Pooled(c, states, now)
	after := 0.0
	var maxTS int64 = math.MinInt64
	for i, s := range next {
		after += s.Value
		// Time never runs backwards for a stored row.
		if s.TS < in[i].TS {
			fail("shard %d: TS moved back from %d to %d", i, in[i].TS, s.TS)
		}
		maxTS = max(maxTS, in[i].TS)
	}
	for i, s := range next {
		// No instant later than both now and the latest stored TS appears.
		if s.TS > max(now, maxTS) {
			fail("shard %d: TS %d beyond now %d and every stored TS", i, s.TS, now)
		}
	}
	// The new state, projected to the same instant, gains nothing: no
	// stretch of time is credited twice.
	if p := Pooled(c, next, now); math.Abs(p-after) > tol {
		fail("new state gains %v when projected to the same instant", p-after)
	}
	// Never more is admitted than the pooled tokens allow: what is left is
	// what was there minus count (or zero, when a rounding-sized shortfall
	// was forgiven).
	if after > before-count+tol || (after < before-count-tol && after != 0) {
		fail("grant left %v, want %v - %v = %v", after, before, count, before-count)
	}
	if !reserve {
		if d.RetryAfter != 0 {
			fail("plain grant with RetryAfter %d", d.RetryAfter)
		}
		if after < -tol {
			fail("plain grant left the pooled value at %v", after)
		}
		return next, d
	}
	if c.MaxReserved > 0 && after < -c.MaxReserved*float64(n)-tol {
		fail("reservation went %v deep, MaxReserved %v per shard", after, c.MaxReserved)
	}
	if after < -tol && d.RetryAfter == 0 {
		fail("reservation into debt %v with RetryAfter 0", after)
	}
	if d.RetryAfter > 0 && d.RetryAfter < maxRetry {
		// The reserved tokens exist once RetryAfter has passed.
		if p := Pooled(c, next, now+d.RetryAfter); p < -tol {
			fail("reservation: pooled value %v at now+RetryAfter (%d)", p, d.RetryAfter)
		}
	}
	return next, d
}

// checkNotLate checks, for a token bucket whose shards all have their TS at
// or before now, that RetryAfter is not much later than needed: a little
// before it (far enough that the shortfall exceeds the tolerance) the call is
// still denied.
func checkNotLate(t *testing.T, c Config, states []State, now int64, count float64, reserve bool, ra int64) {
	t.Helper()
	if c.Kind != TokenBucket {
		return
	}
	for _, s := range states {
		if s.TS > now {
			return
		}
	}
	perMicro := c.Rate / float64(c.Period)
	d := 2 + math.Ceil(2*slop(c, states, count)/perMicro)
	if d >= float64(ra) {
		return
	}
	if _, d2 := TakeShards(c, states, now+ra-int64(d), count, reserve); d2.OK {
		t.Fatalf("RetryAfter %d is late: already granted %d µs earlier\nconfig=%+v states=%+v now=%d count=%v reserve=%v",
			ra, int64(d), c, states, now, count, reserve)
	}
}

// FuzzTake checks Take on one bucket against the invariants and against the
// formulas of DESIGN.md, evaluated independently here.
func FuzzTake(f *testing.F) {
	// kind, rate, period, capacity, maxReserved, value, ts, now, count, reserve
	f.Add(uint8(1), 10.0, 60*sec, 10.0, 0.0, 0.0, t0, t0+6*sec, 1.0, false)
	f.Add(uint8(1), 7.0, sec, 7.0, 0.0, 0.0, t0, t0, 1.0, false)
	f.Add(uint8(1), 1.0, sec, 1.0, 2.0, -2.0, t0, t0, 1.0, true)
	f.Add(uint8(1), 1.0, sec, 1.0, 0.0, 0.0, t0+5*sec, t0+3*sec, 1.0, false)
	f.Add(uint8(1), 1.0, sec, 1.0, 0.0, 0.0, t0+5*sec, t0+3*sec, 1.0, true)
	f.Add(uint8(1), 3.0, sec, 3.0, 0.0, 8.0, t0, t0, 3.0, false) // above capacity
	f.Add(uint8(2), 10.0, 60*sec, 10.0, 0.0, 3.0, t0, t0+20*sec, 10.0, false)
	f.Add(uint8(2), 100.0, 3600*sec, 150.0, 0.0, 70.0, t0, t0+3600*sec, 150.0, false)
	f.Add(uint8(2), 10.0, 60*sec, 10.0, 0.0, -15.0, t0, t0+20*sec, 10.0, true)
	f.Add(uint8(2), 10.0, 60*sec, 10.0, 5.0, -3.0, t0+120*sec, t0+30*sec, 5.0, true)
	f.Add(uint8(2), 1e4, 60*sec, 1.0, 0.0, 0.999999998, t0, t0+sec, 1.0, false)
	f.Add(uint8(2), 1e6, 60*sec, 1.0, 0.0, -999999.0000005, t0, t0+sec, 1.0, false)
	// Instants beyond 2^53 µs, where float64 no longer holds every microsecond.
	// (sec and t0 are the constants of algo_test.go.)
	f.Add(uint8(2), 1.0, sec, 1.0, 0.0, 0.0, int64(9_900_000_000_000_000), int64(9_900_000_000_500_003), 1.0, false)
	f.Add(uint8(2), 0.5, int64(3), 2.0, 0.0, 0.0, int64(-7), int64(-5), 1.5, false)

	f.Fuzz(func(t *testing.T, kind uint8, rate float64, period int64, capacity, maxReserved, value float64, ts, now int64, count float64, reserve bool) {
		c, ok := fuzzConfig(kind, rate, period, capacity, maxReserved)
		if !ok || !finite(value) || !finite(count) {
			t.Skip()
		}
		rate, period, capacity, maxReserved = c.Rate, c.Period, c.Capacity, c.MaxReserved
		value = fold(value, math.Min(maxTokens, maxDebtRatio*math.Max(1, capacity)))
		count = fold(count, math.Min(maxTokens, maxDebtRatio*math.Max(1, capacity)))
		ts, now = foldInt(ts, maxInstant), foldInt(now, maxInstant)
		s := State{Value: value, TS: ts}
		if !validState(c, s) || !validRequest(c, 1, count, reserve) {
			t.Skip()
		}
		next, d := checkTake(t, c, []State{s}, now, count, reserve)

		// Take is TakeShards with one shard.
		one, d1 := Take(c, s, now, count, reserve)
		if one != next[0] || d1 != d {
			t.Fatalf("Take = %+v %+v, TakeShards = %+v %+v", one, d1, next[0], d)
		}

		// The spec's formulas, computed here without the package's helpers.
		want := value
		wantTS := ts
		if elapsed := now - ts; elapsed > 0 {
			if c.Kind == FixedWindow {
				k := elapsed / period
				want += rate * float64(k)
				wantTS = ts + k*period
			} else {
				want += float64(elapsed) * rate / float64(period)
				wantTS = now
			}
		}
		want = math.Min(want, capacity) - count
		// The library forgives a shortfall up to its tolerance; e bounds
		// float64 rounding, and an input within e of a threshold may go
		// either way.
		tol := slop(c, []State{s}, count)
		e := tol - tolerance(c)
		debt := -want
		switch {
		case debt <= tolerance(c)-e:
			if !d.OK || d.RetryAfter != 0 {
				t.Fatalf("value after take %v, want a plain grant, got %+v", want, d)
			}
		case debt <= tolerance(c)+e:
			// Either way.
		case !reserve || (maxReserved > 0 && debt > maxReserved+tolerance(c)+e):
			if d.OK {
				t.Fatalf("value after take %v, want a denial, got %+v", want, d)
			}
		case maxReserved == 0 || debt <= maxReserved+tolerance(c)-e:
			if !d.OK || d.RetryAfter <= 0 {
				t.Fatalf("value after take %v, want a reservation, got %+v", want, d)
			}
		}
		if d.OK {
			if math.Abs(math.Max(want, 0)-math.Max(next[0].Value, 0)) > tol || (reserve && math.Abs(want-next[0].Value) > tol) {
				t.Fatalf("value %v, want %v", next[0].Value, want)
			}
			if next[0].TS != wantTS {
				t.Fatalf("TS %d, want %d", next[0].TS, wantTS)
			}
		}
		if d.OK && d.RetryAfter > 0 && c.Kind == TokenBucket {
			// Reservation: the debt is repaid at Rate/Period, after any
			// stretch of time the stored TS is ahead of now.
			ra := float64(max(wantTS-now, 0)) + -want*float64(period)/rate
			if float64(d.RetryAfter) < ra-1 || float64(d.RetryAfter) > ra+2+ra*1e-9 {
				t.Fatalf("reservation RetryAfter %d, want about %v", d.RetryAfter, ra)
			}
		}
		if d.OK && d.RetryAfter > 0 && c.Kind == FixedWindow {
			// Reservation: whole windows from the window start.
			w := math.Ceil(-want / rate)
			ra := float64(wantTS-now) + float64(period)*w
			if float64(d.RetryAfter) != ra && float64(d.RetryAfter) != ra+float64(period) && float64(d.RetryAfter) != ra-float64(period) {
				t.Fatalf("reservation RetryAfter %d, want about %v", d.RetryAfter, ra)
			}
		}
	})
}

// FuzzTakeShards checks TakeShards and CreditShards over 1 to 8 shards whose
// values and timestamps differ (layout gives each shard's offset from value
// and ts).
func FuzzTakeShards(f *testing.F) {
	// kind, rate, period, capacity, maxReserved, value, ts, now, count, reserve, shards, layout
	f.Add(uint8(1), 2.5, sec, 2.5, 0.0, 2.5, t0, t0, 7.6, false, uint8(3), []byte{0x80, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), 1.0, sec, 1.0, 0.0, 0.0, t0, t0, 3.5, false, uint8(3), []byte{127, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), 0.75, sec, 0.75, 0.0, 0.75, t0, t0, 5.0, true, uint8(3), []byte{})
	f.Add(uint8(1), 1.0, sec, 1.0, 0.5, -0.5, t0, t0, 3.9, true, uint8(3), []byte{4, 1, 8, 0, 0, 2, 0x80, 0x80})
	f.Add(uint8(1), 1.0, sec, 1.0, 0.0, 0.5, t0, t0-sec, 3.9, false, uint8(7), []byte{4, 9, 8, 0, 0, 0x92, 0x80, 0x80})
	f.Add(uint8(2), 1.0, 60*sec, 1.0, 0.0, 0.0, t0, t0+30*sec, 3.5, false, uint8(3), []byte{127, 0, 0, 0})
	f.Add(uint8(2), 2.5, 60*sec, 5.0, 1.0, -1.0, t0, t0+61*sec, 12.0, true, uint8(1), []byte{3, 7, 0x90, 5})
	f.Add(uint8(2), 10.0, 60*sec, 10.0, 0.0, 3.0, t0, t0+20*sec, 10.0, false, uint8(0), []byte{})

	f.Fuzz(func(t *testing.T, kind uint8, rate float64, period int64, capacity, maxReserved, value float64, ts, now int64, count float64, reserve bool, shards uint8, layout []byte) {
		c, ok := fuzzConfig(kind, rate, period, capacity, maxReserved)
		if !ok || !finite(value) || !finite(count) {
			t.Skip()
		}
		value = fold(value, math.Min(maxTokens, maxDebtRatio*math.Max(1, c.Capacity)))
		count = fold(count, math.Min(maxTokens, maxDebtRatio*math.Max(1, c.Capacity)))
		ts, now = foldInt(ts, maxInstant), foldInt(now, maxInstant)
		n := 1 + int(shards%8)
		if !validRequest(c, n, count, reserve) {
			t.Skip()
		}
		states := make([]State, n)
		for i := range states {
			s := State{Value: value, TS: ts}
			if 2*i+1 < len(layout) {
				// Special bytes give exact full and empty shards; others
				// shift value by sixteenths of the capacity and ts by
				// eighths of the period.
				switch b := int8(layout[2*i]); b {
				case 127:
					s.Value = c.Capacity
				case -128:
					s.Value = 0
				default:
					s.Value += float64(b) * c.Capacity / 16
				}
				s.TS += int64(int8(layout[2*i+1])) * max(c.Period/8, 1)
			}
			if !validState(c, s) {
				t.Skip()
			}
			states[i] = s
		}
		next, d := checkTake(t, c, states, now, count, reserve)

		// A reservation's RetryAfter is that of one unsharded bucket of
		// the same total config holding the same pooled value.
		if d.OK && d.RetryAfter > 0 && c.Kind == TokenBucket {
			nf := float64(n)
			total := Config{Kind: c.Kind, Rate: c.Rate * nf, Period: c.Period, Capacity: c.Capacity * nf, MaxReserved: c.MaxReserved * nf}
			var left float64
			for _, s := range next {
				left += s.Value
			}
			ra := RetryAfter(total, State{Value: left, TS: next[0].TS}, now)
			if diff := ra - d.RetryAfter; diff < -1-d.RetryAfter/1e9 || diff > 1+d.RetryAfter/1e9 {
				t.Fatalf("sharded reservation RetryAfter %d, unsharded %d", d.RetryAfter, ra)
			}
		}

		// Credit never lifts the pooled value above the pooled capacity,
		// never lowers it, and moves no TS back.
		credited := CreditShards(c, states, now, count)
		before := Pooled(c, states, now)
		var after float64
		for i, s := range credited {
			if !finite(s.Value) || s.Value > c.Capacity+tolerance(c) {
				t.Fatalf("credit: shard %d value %v (capacity %v)", i, s.Value, c.Capacity)
			}
			if s.TS < states[i].TS {
				t.Fatalf("credit: shard %d TS moved back", i)
			}
			after += s.Value
		}
		tol := slop(c, states, count)
		if want := math.Min(before+count, c.Capacity*float64(n)); math.Abs(after-want) > tol {
			t.Fatalf("credit: pooled %v, want %v", after, want)
		}
	})
}

var (
	randomIterations = flag.Int("algo.random", 20000, "iterations of TestTakeShardsRandom")
	randomSeed       = flag.Uint64("algo.seed", 1, "seed of TestTakeShardsRandom")
)

// TestTakeShardsRandom runs checkTake over inputs drawn to sit on the edges
// coverage-guided fuzzing rarely finds on its own: values a tolerance away
// from the count, rates far above or below the capacity, clocks that stepped
// back, instants beyond 2^53 µs. The seed is fixed, so the test is
// deterministic; raise -algo.random (and vary -algo.seed) to search longer.
func TestTakeShardsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(*randomSeed, 2))
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	logUniform := func(lo, hi float64) float64 {
		return math.Exp(math.Log(lo) + r.Float64()*(math.Log(hi)-math.Log(lo)))
	}
	checked, denied, reserved := 0, 0, 0
	for i := 0; i < *randomIterations; i++ {
		c := Config{Kind: TokenBucket}
		if r.IntN(2) == 0 {
			c.Kind = FixedWindow
		}
		c.Capacity = pick(1, 2.5, 10, 150, 1e-3, 1e6, logUniform(1e-6, 1e9))
		c.Rate = c.Capacity * pick(1, 0.5, 2, 1e-3, 1e3, 1e4, logUniform(1e-6, 1e6))
		c.Period = int64(pick(1, 1000, 1e6, 60e6, 3600e6, float64(1+r.Int64N(1e13))))
		if r.IntN(2) == 0 {
			c.MaxReserved = c.Capacity * pick(0.5, 1, 2, logUniform(1e-3, 1e3))
		}
		if c.Rate < 1e-9 || c.Rate > maxTokens || c.Capacity > maxTokens {
			continue
		}
		n := 1 + r.IntN(8)
		nf := float64(n)
		reserve := r.IntN(3) == 0
		var now int64
		switch r.IntN(3) {
		case 0:
			now = 1_700_000_000_000_000 + r.Int64N(1e12)
		case 1:
			now = maxInstant - r.Int64N(1e15) // beyond 2^53
		default:
			now = r.Int64N(2*maxInstant) - maxInstant
		}
		count := pick(0, c.Capacity*nf, c.Capacity*nf*r.Float64(), 1, 0.1, c.Capacity)
		if reserve && r.IntN(2) == 0 {
			count *= pick(2, 10, 1.5)
		}
		tol := tolerance(c)
		states := make([]State, n)
		base := pick(c.Capacity, 0, -c.MaxReserved, count/nf, c.Capacity*(4*r.Float64()-3))
		for j := range states {
			v := base
			switch r.IntN(5) {
			case 0:
				v = c.Capacity
			case 1:
				v = 0
			case 2:
				v = base + float64(r.IntN(7)-3)*tol*pick(0.5, 1, 2)
			case 3:
				v = c.Capacity * (2*r.Float64() - 1)
			}
			var ts int64
			switch r.IntN(4) {
			case 0:
				ts = now
			case 1:
				ts = now - r.Int64N(3)*c.Period - r.Int64N(c.Period)
			case 2:
				ts = now + r.Int64N(3*c.Period+1) // clock stepped back
			default:
				ts = now - r.Int64N(1e9)
			}
			states[j] = State{Value: v, TS: ts}
		}
		if !validRequest(c, n, count, reserve) {
			continue
		}
		valid := validInstant(now)
		for _, s := range states {
			valid = valid && validState(c, s)
		}
		if !valid {
			continue
		}
		_, d := checkTake(t, c, states, now, count, reserve)
		checked++
		if !d.OK {
			denied++
		} else if d.RetryAfter > 0 {
			reserved++
		}
	}
	t.Logf("checked %d inputs: %d denials, %d reservations with a wait", checked, denied, reserved)
}
