package algo

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The invariants of the sliding and calendar windows and of TakeUpTo, for
// every valid input (the exact numbers are in sliding_test.go,
// calendar_test.go and upto_test.go). Run the fuzz targets with, for
// example:
//
//	go test ./algo -run='^$' -fuzz='^FuzzSlidingTake$' -fuzztime=60s
//	go test ./algo -run='^$' -fuzz='^FuzzCalendarWindow$' -fuzztime=60s
//	go test ./algo -run='^$' -fuzz='^FuzzCalendarTake$' -fuzztime=60s
//	go test ./algo -run='^$' -fuzz='^FuzzTakeUpTo$' -fuzztime=60s

var windowsIterations = flag.Int("algo.windows", 300, "call sequences of the windows' property tests")

// testZones are the zones of the calendar property and fuzz tests: DST of
// an hour both ways and of half an hour (Lord Howe), DST at midnight
// (Havana, Santiago, São Paulo, Beirut), transitions at 00:01 (St. John's,
// before 2011), offsets of :30 and :45 (Tehran, Kathmandu, Chatham),
// negative DST (Dublin), DST suspended for Ramadan (Casablanca), a date
// skipped (Apia) and UTC.
var testZones = func() []*time.Location {
	var out []*time.Location
	for _, name := range []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu",
		"America/Havana", "America/St_Johns", "America/Sao_Paulo", "America/Santiago", "Asia/Beirut",
		"Pacific/Chatham", "Europe/Dublin", "Africa/Casablanca", "Asia/Tehran", "Pacific/Apia"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			panic(err)
		}
		out = append(out, loc)
	}
	return out
}()

// unitLength returns the most a calendar window of unit can last.
func unitLength(unit CalendarUnit) int64 {
	switch unit {
	case Day:
		return 26 * hour
	case Week:
		return 7*24*hour + 2*hour
	case Month:
		return 31*24*hour + 2*hour
	}
	return 366*24*hour + 2*hour
}

func fuzzCalendar(zone, unit, weekday uint8) Calendar {
	return Calendar{
		Unit:     CalendarUnit(unit%4 + 1),
		Weekday:  time.Weekday(weekday % 7),
		Location: testZones[int(zone)%len(testZones)],
	}
}

// checkWindow checks that Window(at) is the window that holds at, that it
// starts at the first instant of a local date on which a window of its
// unit starts, and that its neighbours meet it.
func checkWindow(t *testing.T, cal Calendar, at int64) (int64, int64) {
	t.Helper()
	start, end := cal.Window(at)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%v (unit %d, weekday %v) at %v: window [%v, %v): "+format, append([]any{cal.location(), cal.Unit, cal.Weekday,
			time.UnixMicro(at).UTC(), time.UnixMicro(start).UTC(), time.UnixMicro(end).UTC()}, args...)...)
	}
	if start > at || at >= end {
		fail("does not hold the instant")
	}
	if s, e := cal.Window(start); s != start || e != end {
		fail("the window at its start is [%v, %v)", s, e)
	}
	if s, _ := cal.Window(end); s != end {
		fail("the next window starts at %v", time.UnixMicro(s).UTC())
	}
	if _, e := cal.Window(start - 1); e != start {
		fail("the window before ends at %v", time.UnixMicro(e).UTC())
	}
	// start is the first instant of its local date: a microsecond before,
	// the clock read an earlier date.
	local := time.UnixMicro(start).In(cal.location())
	y, m, d := local.Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	before := time.UnixMicro(start - 1).In(cal.location())
	by, bm, bd := before.Date()
	if !time.Date(by, bm, bd, before.Hour(), before.Minute(), before.Second(), before.Nanosecond(), time.UTC).Before(midnight) {
		fail("a microsecond before its start the clock read %v, not before %v", before, midnight)
	}
	if cal.location().String() == "Pacific/Apia" {
		// A window whose first date was skipped starts on the next.
		return start, end
	}
	switch {
	case cal.Unit == Week && local.Weekday() != cal.Weekday,
		cal.Unit == Month && d != 1,
		cal.Unit == Year && (d != 1 || m != time.January):
		fail("it starts on %v, local %v", local.Weekday(), local)
	}
	return start, end
}

func FuzzCalendarWindow(f *testing.F) {
	// zone, unit, weekday, instant
	f.Add(uint8(1), uint8(0), uint8(0), utc(2024, 3, 10, 12, 0))
	f.Add(uint8(4), uint8(0), uint8(0), utc(1986, 1, 1, 0, 0))
	f.Add(uint8(5), uint8(0), uint8(0), utc(2023, 11, 5, 4, 30))
	f.Add(uint8(6), uint8(0), uint8(0), utc(2006, 10, 29, 2, 45))
	f.Add(uint8(14), uint8(0), uint8(5), utc(2011, 12, 30, 10, 0))
	f.Add(uint8(2), uint8(1), uint8(1), utc(2024, 3, 31, 12, 0))
	f.Add(uint8(3), uint8(2), uint8(0), utc(2023, 10, 15, 0, 0))
	f.Add(uint8(0), uint8(2), uint8(0), utc(2024, 2, 29, 12, 0))
	f.Add(uint8(12), uint8(3), uint8(0), int64(-1))
	f.Fuzz(func(t *testing.T, zone, unit, weekday uint8, at int64) {
		at = foldInt(at, maxInstant)
		checkWindow(t, fuzzCalendar(zone, unit, weekday), at)
	})
}

// FuzzCalendarTake checks Take on calendar windows against the invariants
// of every kind (checkTake, which reads Period as the longest a window can
// last) and requires RetryAfter exact: a denial is granted at
// now+RetryAfter and denied a microsecond before, and a grant stamps the
// start of a calendar window.
func FuzzCalendarTake(f *testing.F) {
	// zone, unit, weekday, rate, capacity, maxReserved, value, ts, now, count, reserve, shards, layout
	f.Add(uint8(2), uint8(2), uint8(0), 1000.0, 1000.0, 0.0, 0.0, utc(2024, 2, 29, 23, 0), utc(2024, 3, 15, 12, 0), 1.0, false, uint8(0), []byte{})
	f.Add(uint8(1), uint8(0), uint8(0), 3.0, 3.0, 0.0, 0.0, utc(2024, 3, 10, 5, 0), utc(2024, 3, 10, 6, 0), 1.0, false, uint8(0), []byte{})
	f.Add(uint8(2), uint8(2), uint8(0), 250.0, 250.0, 0.0, 250.0, int64(0), utc(2024, 3, 15, 12, 0), 1500.0, true, uint8(3), []byte{127, 0, 0x80, 0})
	f.Add(uint8(4), uint8(0), uint8(0), 2.0, 5.0, 1.0, -1.0, utc(1985, 12, 30, 18, 30), utc(1986, 1, 1, 0, 0), 3.0, true, uint8(1), []byte{3, 1, 0x90, 2})
	f.Add(uint8(6), uint8(1), uint8(3), 7.0, 7.0, 0.0, 2.0, utc(2006, 10, 29, 2, 30), utc(2006, 10, 29, 2, 45), 5.0, false, uint8(0), []byte{})
	f.Fuzz(func(t *testing.T, zone, unit, weekday uint8, rate, capacity, maxReserved, value float64, ts, now int64, count float64, reserve bool, shards uint8, layout []byte) {
		cal := fuzzCalendar(zone, unit, weekday)
		c, ok := fuzzConfig(2, rate, 1, capacity, maxReserved)
		if !ok || !finite(value) || !finite(count) {
			t.Skip()
		}
		// algo ignores Period for calendar windows; checkTake reads it as
		// the longest a window lasts.
		c.Calendar, c.Period = cal, unitLength(cal.Unit)
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
				s.Value += float64(int8(layout[2*i])) * c.Capacity / 16
				s.TS += int64(int8(layout[2*i+1])) * 3 * hour
			}
			if !validState(c, s) {
				t.Skip()
			}
			states[i] = s
		}
		next, d := checkTake(t, c, states, now, count, reserve)
		checkCalendarDecision(t, c, states, now, count, reserve, next, d)
	})
}

func checkCalendarDecision(t *testing.T, c Config, states []State, now int64, count float64, reserve bool, next []State, d Decision) {
	t.Helper()
	if !d.OK && !d.Overflow && d.RetryAfter < min(maxRetry, MaxWait) {
		if _, d2 := TakeShards(c, states, now+d.RetryAfter-1, count, reserve); d2.OK {
			t.Fatalf("calendar: RetryAfter %d is late: granted a microsecond before\nconfig=%+v states=%+v now=%d count=%v reserve=%v",
				d.RetryAfter, c, states, now, count, reserve)
		}
	}
	latest := slices.MaxFunc(states, func(a, b State) int { return cmpInt(a.TS, b.TS) }).TS
	if d.OK && now >= latest {
		// Every shard is stamped the call's instant: a calendar row keeps
		// the time of its last write, which lies in the window that holds
		// now (TS never moves back).
		for i, s := range next {
			if s.TS != now {
				t.Fatalf("calendar: shard %d stamped %v, not the call's instant %v", i,
					time.UnixMicro(s.TS).UTC(), time.UnixMicro(now).UTC())
			}
		}
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// validSliding reports whether s is a state a SlidingWindow of c can hold
// within the sane ranges: a count and a non-negative Prev.
func validSliding(c Config, s State) bool {
	bound := math.Min(maxTokens, maxDebtRatio*math.Max(1, c.Capacity))
	return finite(s.Value) && math.Abs(s.Value) <= bound &&
		finite(s.Prev) && s.Prev >= 0 && s.Prev <= bound && validInstant(s.TS)
}

// slidingSlop is slop for sliding states, whose Prev is a magnitude too.
func slidingSlop(c Config, states []State, count float64) float64 {
	m := 0.0
	for _, s := range states {
		m += math.Abs(s.Prev) + math.Abs(c.Rate)
	}
	return slop(c, states, count) + 1e-13*m
}

// checkSlidingTake is checkTake for a SlidingWindow, whose Value is a
// count: it checks the pooled tokens instead, and that RetryAfter is exact
// both ways.
func checkSlidingTake(t *testing.T, c Config, states []State, now int64, count float64, reserve bool) ([]State, Decision) {
	t.Helper()
	in := slices.Clone(states)
	next, d := TakeShards(c, states, now, count, reserve)
	n := len(states)
	nf := float64(n)
	tol := slidingSlop(c, states, count)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nconfig=%+v\nstates=%+v\nnow=%d count=%v reserve=%v\nnext=%+v decision=%+v",
			append(args, c, in, now, count, reserve, next, d)...)
	}
	if !slices.Equal(in, states) {
		fail("TakeShards mutated its input")
	}
	if d.RetryAfter < 0 || len(next) != n {
		fail("RetryAfter %d, %d states for %d shards", d.RetryAfter, len(next), n)
	}
	before := Pooled(c, states, now)
	if before > c.Capacity*nf+tol {
		fail("pooled %v above the pooled capacity", before)
	}
	// The tokens only grow while nothing is taken.
	for _, later := range []int64{1, c.Period / 3, c.Period - 1, c.Period, 7 * c.Period / 3} {
		if later > 0 && validInstant(now+later) {
			if p := Pooled(c, states, now+later); p < before-tol {
				fail("pooled %v at now, %v %d µs later", before, p, later)
			}
		}
	}
	if d.Overflow || !d.OK {
		if !slices.Equal(next, in) {
			fail("a refusal changed the states")
		}
		if d.Overflow {
			if d.OK || d.RetryAfter != 0 || !reserve {
				fail("overflow with OK=%v RetryAfter=%d reserve=%v", d.OK, d.RetryAfter, reserve)
			}
			return next, d
		}
		if d.RetryAfter <= 0 {
			fail("denied with RetryAfter %d", d.RetryAfter)
		}
		if d.RetryAfter < min(maxRetry, MaxWait) {
			if _, d2 := TakeShards(c, states, now+d.RetryAfter, count, reserve); !d2.OK && !d2.Overflow {
				fail("denied again at now+RetryAfter (%+v)", d2)
			}
			if _, d2 := TakeShards(c, states, now+d.RetryAfter-1, count, reserve); d2.OK {
				fail("RetryAfter %d is late: granted a microsecond before", d.RetryAfter)
			}
		}
		return next, d
	}

	// A grant.
	var maxTS int64 = math.MinInt64
	for i, s := range next {
		if !finite(s.Value) || !finite(s.Prev) || s.Prev < -tol {
			fail("shard %d: count %v, prev %v", i, s.Value, s.Prev)
		}
		if s.Value < c.low()-tol {
			fail("shard %d: count %v below a full window's %v", i, s.Value, c.low())
		}
		if s.TS < in[i].TS {
			fail("shard %d: TS moved back", i)
		}
		maxTS = max(maxTS, in[i].TS)
	}
	for i, s := range next {
		if s.TS > max(now, maxTS) {
			fail("shard %d: TS %d beyond now and every stored TS", i, s.TS)
		}
	}
	after := Pooled(c, next, now)
	if after > c.Capacity*nf+tol {
		fail("grant left %v, above the pooled capacity", after)
	}
	if after > before-count+tol || (after < before-count-tol && math.Abs(after) > tol) {
		fail("grant left %v, want %v - %v = %v", after, before, count, before-count)
	}
	if !reserve {
		if d.RetryAfter != 0 || after < -tol {
			fail("plain grant: RetryAfter %d, left %v", d.RetryAfter, after)
		}
		return next, d
	}
	if c.MaxReserved > 0 && after < -c.MaxReserved*nf-tol {
		fail("reservation went %v deep, MaxReserved %v per shard", after, c.MaxReserved)
	}
	if after < -tol && d.RetryAfter == 0 {
		fail("reservation into debt %v with RetryAfter 0", after)
	}
	if d.RetryAfter > 0 && d.RetryAfter < maxRetry {
		// The reserved tokens exist at RetryAfter, and not a microsecond
		// before (the test TakeShards grants by).
		ntol := tolerance(c) * nf
		if p := Pooled(c, next, now+d.RetryAfter); p < -ntol {
			fail("reservation: pooled %v at now+RetryAfter", p)
		}
		if p := Pooled(c, next, now+d.RetryAfter-1); p >= -ntol {
			fail("reservation: pooled %v already a microsecond before RetryAfter %d", p, d.RetryAfter)
		}
	}
	return next, d
}

// FuzzSlidingTake checks TakeShards and CreditShards on a SlidingWindow of 1
// to 8 shards whose counts, Prevs and timestamps differ.
func FuzzSlidingTake(f *testing.F) {
	// rate, period, capacity, maxReserved, value, prev, ts, now, count, reserve, shards, layout
	f.Add(10.0, minute, 10.0, 0.0, 10.0, 0.0, clock(12, 0, 0), clock(12, 1, 1), 1.0, false, uint8(0), []byte{})
	f.Add(1.0, minute, 1.0, 0.0, 1.0, 0.0, clock(12, 0, 0), clock(12, 0, 31), 1.0, false, uint8(0), []byte{})
	f.Add(10.0, minute, 10.0, 0.0, 0.0, 0.0, clock(12, 0, 0), clock(12, 0, 0), 25.0, true, uint8(0), []byte{})
	f.Add(10.0, minute, 10.0, 5.0, 12.0, 0.0, clock(12, 0, 0), clock(12, 0, 0), 4.0, true, uint8(0), []byte{})
	f.Add(10.0, minute, 30.0, 0.0, -20.0, 0.0, clock(12, 0, 0), clock(12, 1, 30), 30.0, false, uint8(0), []byte{})
	f.Add(2.5, minute, 2.5, 0.0, 0.0, 2.0, clock(12, 0, 0), clock(12, 0, 45), 3.0, false, uint8(1), []byte{0, 0, 0, 0, 0, 4, 0x80, 0x80})
	f.Add(2.5, minute, 2.5, 0.0, 2.5, 0.0, clock(12, 0, 0), clock(12, 1, 1), 1.0, false, uint8(3), []byte{16, 0, 0, 8, 0, 0, 3, 0})
	f.Add(10.0, minute, 10.0, 0.0, 4.0, 6.0, clock(12, 2, 0), clock(12, 0, 30), 1.0, true, uint8(0), []byte{})
	f.Add(3.0, int64(7), 5.0, 1.0, 1.0, 2.0, int64(-9), int64(5), 2.5, true, uint8(2), []byte{1, 2, 3, 4, 5, 6})
	f.Add(1e6, minute, 1.0, 0.0, 0.5, 1e6, clock(12, 0, 0), clock(12, 0, 1), 1.0, false, uint8(0), []byte{})

	f.Fuzz(func(t *testing.T, rate float64, period int64, capacity, maxReserved, value, prev float64, ts, now int64, count float64, reserve bool, shards uint8, layout []byte) {
		c, ok := fuzzConfig(1, rate, period, capacity, maxReserved)
		if !ok || !finite(value) || !finite(prev) || !finite(count) {
			t.Skip()
		}
		c.Kind = SlidingWindow
		bound := math.Min(maxTokens, maxDebtRatio*math.Max(1, c.Capacity))
		value, prev, count = fold(value, bound), math.Abs(fold(prev, bound)), fold(count, bound)
		ts, now = foldInt(ts, maxInstant), foldInt(now, maxInstant)
		n := 1 + int(shards%8)
		if !validRequest(c, n, count, reserve) || !validInstant(now) {
			t.Skip()
		}
		states := make([]State, n)
		for i := range states {
			s := State{Value: value, TS: ts, Prev: prev}
			if 3*i+2 < len(layout) {
				// Shift the count and Prev by sixteenths of the
				// capacity, ts by eighths of the period; 127 is a full
				// shard.
				if b := int8(layout[3*i]); b == 127 {
					s = State{Value: c.low(), TS: ts}
				} else {
					s.Value += float64(b) * c.Capacity / 16
				}
				s.Prev = math.Abs(s.Prev + float64(int8(layout[3*i+1]))*c.Capacity/16)
				s.TS += int64(int8(layout[3*i+2])) * max(c.Period/8, 1)
			}
			if !validSliding(c, s) {
				t.Skip()
			}
			states[i] = s
		}
		next, d := checkSlidingTake(t, c, states, now, count, reserve)

		// Shards that share a window are one unsharded window of the
		// whole config holding their sum.
		aligned := true
		for _, s := range states {
			aligned = aligned && s.TS == states[0].TS
		}
		if aligned && d.OK {
			whole := Config{Kind: SlidingWindow, Rate: c.Rate * float64(n), Period: c.Period, Capacity: c.Capacity * float64(n), MaxReserved: c.MaxReserved * float64(n)}
			var sum State
			for _, s := range next {
				sum = State{Value: sum.Value + s.Value, TS: s.TS, Prev: sum.Prev + s.Prev}
			}
			tol := slidingSlop(c, states, count)
			for _, later := range []int64{0, c.Period / 2, c.Period, 5 * c.Period / 2} {
				if validInstant(now + later) {
					if a, b := Pooled(c, next, now+later), Pooled(whole, []State{sum}, now+later); math.Abs(a-b) > tol {
						t.Fatalf("%d µs later: shards pool %v, one window %v", later, a, b)
					}
				}
			}
		}

		// Credit gives back count, never above the pooled capacity, and
		// moves no TS back.
		credited := CreditShards(c, states, now, count)
		before, after := Pooled(c, states, now), Pooled(c, credited, now)
		tol := slidingSlop(c, states, count)
		if want := math.Min(before+count, c.Capacity*float64(n)); math.Abs(after-want) > tol {
			t.Fatalf("credit: pooled %v, want %v", after, want)
		}
		for i, s := range credited {
			if s.TS < states[i].TS || s.Prev < -tol || s.Value < c.low()-tol {
				t.Fatalf("credit: shard %d %+v from %+v", i, s, states[i])
			}
		}
		// Resharding keeps the tokens (capped at the new capacity).
		m := 1 + int(uint8(len(layout))%5)
		to := c
		to.Rate, to.Capacity, to.MaxReserved = c.Rate*float64(n)/float64(m), c.Capacity*float64(n)/float64(m), c.MaxReserved*float64(n)/float64(m)
		if got := Pooled(to, Reshard(c, states, to, m, now), now); math.Abs(got-math.Min(before, c.Capacity*float64(n))) > tol {
			t.Fatalf("reshard %d -> %d shards: pooled %v, want %v", n, m, got, before)
		}
	})
}

// FuzzTakeUpTo checks TakeUpTo on every kind: it takes n when n fits,
// otherwise the most whole tokens that fit, and denies only when one unit
// does not fit.
func FuzzTakeUpTo(f *testing.F) {
	// kind, rate, period, capacity, value, ts, now, n, shards, layout
	f.Add(uint8(0), 1.0, sec, 10.0, 3.5, t0, t0, 5.0, uint8(0), []byte{})
	f.Add(uint8(0), 1.0, sec, 10.0, 0.75, t0, t0, 5.0, uint8(0), []byte{})
	f.Add(uint8(0), 1.0, sec, 10.0, 0.3, t0, t0, 0.5, uint8(0), []byte{})
	f.Add(uint8(1), 10.0, minute, 10.0, 4.0, w0, w0+20*sec, 10.0, uint8(0), []byte{})
	f.Add(uint8(2), 10.0, minute, 10.0, 10.0, clock(12, 0, 0), clock(12, 1, 30), 10.0, uint8(0), []byte{})
	f.Add(uint8(3), 1000.0, minute, 1000.0, 10.0, utc(2024, 3, 1, 0, 0), utc(2024, 3, 20, 0, 0), 50.0, uint8(0), []byte{})
	f.Add(uint8(0), 2.5, sec, 2.5, 2.5, t0, t0, 10.0, uint8(3), []byte{0x80, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(2), 2.5, minute, 2.5, 1.0, clock(12, 0, 0), clock(12, 0, 45), 4.5, uint8(2), []byte{3, 9, 250, 7})
	f.Fuzz(func(t *testing.T, kind uint8, rate float64, period int64, capacity, value float64, ts, now int64, n float64, shards uint8, layout []byte) {
		c, ok := fuzzConfig(1, rate, period, capacity, 0)
		if !ok || !finite(value) || !finite(n) {
			t.Skip()
		}
		switch kind % 4 {
		case 1:
			c.Kind = FixedWindow
		case 2:
			c.Kind = SlidingWindow
		case 3:
			c.Kind = FixedWindow
			c.Calendar = fuzzCalendar(uint8(period), uint8(period>>8), uint8(period>>16))
		}
		bound := math.Min(maxTokens, maxDebtRatio*math.Max(1, c.Capacity))
		value, n = fold(value, bound), math.Abs(fold(n, bound))
		ts, now = foldInt(ts, maxInstant), foldInt(now, maxInstant)
		k := 1 + int(shards%8)
		capacityAll := c.Capacity * float64(k)
		if min(n, 1) > capacityAll || !validInstant(now) {
			t.Skip()
		}
		states := make([]State, k)
		for i := range states {
			s := State{Value: value, TS: ts}
			if 2*i+1 < len(layout) {
				s.Value += float64(int8(layout[2*i])) * c.Capacity / 16
				s.TS += int64(int8(layout[2*i+1])) * max(c.Period/8, 1)
			}
			if !validSliding(c, s) {
				t.Skip()
			}
			states[i] = s
		}
		in := slices.Clone(states)
		next, d, taken := TakeUpTo(c, states, now, n)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf(format+"\nconfig=%+v\nstates=%+v\nnow=%d n=%v\nnext=%+v decision=%+v taken=%v",
				append(args, c, in, now, n, next, d, taken)...)
		}
		if !slices.Equal(in, states) {
			fail("mutated its input")
		}
		if d.Overflow {
			fail("overflow without a reservation")
		}
		unit := min(n, 1)
		if !d.OK {
			_, want := TakeShards(c, states, now, unit, false)
			if taken != 0 || !slices.Equal(next, in) || d != want {
				fail("a denial must take nothing and wait for one unit (%+v)", want)
			}
			return
		}
		if d.RetryAfter != 0 || taken < 0 || taken > n {
			fail("grant of %v", taken)
		}
		if taken != n && (taken != math.Floor(taken) || taken < unit) {
			fail("took %v: neither n nor whole tokens", taken)
		}
		wantNext, want := TakeShards(c, states, now, taken, false)
		if want != d || !slices.Equal(wantNext, next) {
			fail("differs from TakeShards of %v: %+v %+v", taken, wantNext, want)
		}
		if taken < n {
			// The most: n and one whole token more do not fit.
			if _, d := TakeShards(c, states, now, n, false); d.OK {
				fail("took %v of %v, but %v fits", taken, n, n)
			}
			if more := taken + 1; more < n {
				if _, d := TakeShards(c, states, now, more, false); d.OK {
					fail("took %v, but %v fits", taken, more)
				}
			}
		}
	})
}

// TestSlidingWindowWorstCase is the documented worst case, reached: 10 per
// minute, all 10 at the last microsecond of a window, then a call every
// microsecond the tokens allow. The minute that starts at the 10 admits 19
// (the bound, 10 + 10·(1 - 1µs/60s), rounded down to whole calls).
func TestSlidingWindowWorstCase(t *testing.T) {
	c := slidingWindow(10, minute, 10)
	from := clock(12, 1, 0) - 1
	s := takeEach(t, c, Full(c, 0), from, 10)
	got := 10
	for now := from + 1; now < from+minute; {
		next, d := Take(c, s, now, 1, false)
		if d.OK {
			s = next
			got++
			continue
		}
		now += d.RetryAfter
	}
	if got != 19 {
		t.Fatalf("the minute from %d admitted %d, want 19", from, got)
	}
}

// call is one admitted take of a property test.
type call struct {
	at    int64
	count float64
}

// TestSlidingWindowBound runs random call sequences (bursts at window ends,
// where the weighting is wrong the most, and random gaps) through a sliding
// window of one or more shards, served as a store serves them (one free
// shard alone when it has the tokens, else every shard pooled). It checks
// that no span of Period (or three) admits more than the documented bound,
// that every denial's RetryAfter is exact, and, for one shard of Capacity
// Rate, that every decision is the textbook sliding window counter's.
func TestSlidingWindowBound(t *testing.T) {
	r := rand.New(rand.NewPCG(*randomSeed, 26))
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	worst, compared := 0.0, 0
	for iter := 0; iter < *windowsIterations; iter++ {
		rate := pick(1, 2, 3, 10, 2.5, 100, 0.5)
		capacity := rate * pick(1, 1, 2, 0.5, 1.5, 0.8)
		period := int64(pick(1000, 60e6, 7, 1e6, float64(1+r.Int64N(1e9))))
		origin := r.Int64N(period)
		n := 1 + r.IntN(4)
		nf := float64(n)
		shard := Config{Kind: SlidingWindow, Rate: rate / nf, Period: period, Capacity: capacity / nf}
		whole := false
		if capacity >= 1 && r.IntN(4) > 0 {
			whole = true
		}
		states := make([]State, n)
		for i := range states {
			states[i] = Full(shard, origin)
		}
		textbook := n == 1 && capacity == rate && whole
		var admitted []call
		now := int64(1_700_000_000_000_000) + r.Int64N(period)
		for range 40 + r.IntN(80) {
			switch r.IntN(4) {
			case 0: // the last microsecond of a window
				now = WindowStart(origin, period, now) + period - 1
			case 1: // the first of the next
				now = WindowStart(origin, period, now) + period
			case 2:
				now += r.Int64N(max(period/int64(1+rate), 1))
			}
			count := 1.0
			if !whole {
				count = math.Min(capacity, pick(0.25, 0.5, 1, capacity/3, capacity))
			}
			for try := 0; try < 1+r.IntN(int(math.Ceil(capacity))+1); try++ {
				var next []State
				var d Decision
				i := r.IntN(n)
				if n > 1 && count <= shard.Capacity {
					var one State
					if one, d = Take(shard, states[i], now, count, false); d.OK {
						next = slices.Clone(states)
						next[i] = one
					}
				}
				if next == nil {
					next, d = checkSlidingTake(t, shard, states, now, count, false)
				}
				if textbook {
					// prev·(1 - elapsed/period) + curr + count <= rate.
					start := WindowStart(origin, period, now)
					var prev, curr float64
					for _, a := range admitted {
						switch {
						case a.at >= start:
							curr += a.count
						case a.at >= start-period:
							prev += a.count
						}
					}
					slack := rate - prev*float64(start+period-now)/float64(period) - curr - count
					if math.Abs(slack) > 1e-6 {
						compared++
						if d.OK != (slack >= 0) {
							t.Fatalf("at %d: OK=%v, the textbook counter says %v (prev %v, curr %v)", now, d.OK, slack >= 0, prev, curr)
						}
					}
				}
				if !d.OK {
					break
				}
				states = next
				admitted = append(admitted, call{now, count})
			}
		}
		for _, span := range []int64{period, 3 * period} {
			bound := capacity + math.Min(rate, capacity)*float64(span-1)/float64(period)
			for i, a := range admitted {
				sum, k := 0.0, 0
				for _, b := range admitted[i:] {
					if b.at >= a.at+span {
						break
					}
					sum += b.count
					k++
				}
				if sum > bound+float64(k+1)*tolerance(shard)*nf+1e-12*sum {
					t.Fatalf("rate %v capacity %v period %d over %d shards: %v admitted in [%d, +%d), bound %v", rate, capacity, period, n, sum, a.at, span, bound)
				}
				if span == period {
					worst = math.Max(worst, sum/bound)
				}
			}
		}
	}
	t.Logf("%d sequences; the fullest span of Period reached %.3f of the bound; %d decisions as the textbook counter's", *windowsIterations, worst, compared)
}

// TestCalendarWindowsRandom runs random call sequences across zone
// transitions (found with ZoneBounds, so DST changes and the odd ones of
// testZones), month ends and week starts, and checks that every calendar
// window admits at most Capacity (the quota, when Capacity is Rate), that
// every instant's window is well formed, and that RetryAfter is exact.
func TestCalendarWindowsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(*randomSeed, 27))
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	for iter := 0; iter < *windowsIterations; iter++ {
		cal := fuzzCalendar(uint8(r.IntN(256)), uint8(r.IntN(4)), uint8(r.IntN(7)))
		rate := pick(1, 3, 10, 2.5, 1000)
		capacity := rate * pick(1, 1, 1.5, 0.5)
		n := 1 + r.IntN(3)
		nf := float64(n)
		c := Config{Kind: FixedWindow, Rate: rate / nf, Capacity: capacity / nf, Calendar: cal}
		// Near a transition of the zone between 1975 and 2035, or
		// anywhere when it has none there.
		base := utc(1975, 1, 1, 0, 0) + r.Int64N(60*366*24*hour)
		if _, end := time.UnixMicro(base).In(cal.location()).ZoneBounds(); !end.IsZero() {
			base = end.UnixMicro()
		}
		length := unitLength(cal.Unit)
		now := base - 2*length + r.Int64N(length)
		states := make([]State, n)
		for i := range states {
			states[i] = Full(c, 0)
		}
		perWindow := map[int64]float64{}
		for range 30 + r.IntN(60) {
			now += r.Int64N(length / 4)
			if r.IntN(3) == 0 {
				// The last microsecond of a window or the first of the next.
				_, end := cal.Window(now)
				now = end - 1 + r.Int64N(2)
			}
			start, _ := checkWindow(t, cal, now)
			count := math.Min(capacity, pick(1, 0.5, rate/3, capacity))
			for {
				next, d := checkTake(t, c, states, now, count, false)
				checkCalendarDecision(t, c, states, now, count, false, next, d)
				if !d.OK {
					break
				}
				states = next
				perWindow[start] += count
			}
		}
		for start, sum := range perWindow {
			if sum > capacity+float64(n)*tolerance(c)*(1+capacity/math.Max(rate, 1e-9)) {
				t.Fatalf("%v %d: the window from %v admitted %v, capacity %v", cal.location(), cal.Unit, time.UnixMicro(start).UTC(), sum, capacity)
			}
		}
	}
}

// TestSlidingWindowRandom runs checkSlidingTake over random shards, states
// and calls, as TestTakeShardsRandom does for the other kinds.
func TestSlidingWindowRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(*randomSeed, 28))
	pick := func(xs ...float64) float64 { return xs[r.IntN(len(xs))] }
	checked := map[string]int{}
	for i := 0; i < *randomIterations/4; i++ {
		c := Config{Kind: SlidingWindow}
		c.Capacity = pick(1, 2.5, 10, 150, 1e-3, 1e6)
		c.Rate = c.Capacity * pick(1, 0.5, 2, 1e-3, 1e3)
		c.Period = int64(pick(1, 7, 1000, 1e6, 60e6, 3600e6, float64(1+r.Int64N(1e13))))
		if r.IntN(2) == 0 {
			c.MaxReserved = c.Capacity * pick(0.5, 1, 2)
		}
		n := 1 + r.IntN(8)
		nf := float64(n)
		reserve := r.IntN(3) == 0
		now := 1_700_000_000_000_000 + r.Int64N(1e12)
		count := pick(0, c.Capacity*nf, c.Capacity*nf*r.Float64(), 1, 0.1, c.Capacity)
		if reserve && r.IntN(2) == 0 {
			count *= pick(2, 10, 1.5)
		}
		ts := now - r.Int64N(3)*c.Period - r.Int64N(c.Period)
		states := make([]State, n)
		for j := range states {
			s := State{Value: c.low() + c.Capacity*(4*r.Float64()-1), TS: ts, Prev: c.Rate * r.Float64()}
			switch r.IntN(5) {
			case 0:
				s = Full(c, ts)
			case 1:
				s.TS = now + r.Int64N(2*c.Period+1) // a clock behind
			case 2:
				s.TS = ts - r.Int64N(c.Period) // another phase
			}
			states[j] = s
		}
		valid := validRequest(c, n, count, reserve)
		for _, s := range states {
			valid = valid && validSliding(c, s)
		}
		if !valid {
			continue
		}
		_, d := checkSlidingTake(t, c, states, now, count, reserve)
		checked[fmt.Sprintf("OK=%v reserved=%v", d.OK, d.OK && d.RetryAfter > 0)]++
	}
	t.Logf("checked: %v", checked)
}
