package algo

import (
	"math"
	"time"
)

// CalendarUnit is the length of a calendar window.
type CalendarUnit uint8

const (
	// Day windows start at local midnight.
	Day CalendarUnit = iota + 1
	// Week windows start at local midnight of Calendar.Weekday.
	Week
	// Month windows start at local midnight of the 1st.
	Month
	// Year windows start at local midnight of January 1st.
	Year
)

// Calendar makes the windows of a FixedWindow calendar units in a time zone
// instead of multiples of Period (the zero value keeps windows of Period).
// A window starts at the first instant whose local date and time (in
// Location) is at or after midnight of its first day: local midnight, or
// the jump where the clocks skip midnight (Asia/Kathmandu on 1986-01-01),
// or the first midnight where it happens twice (America/Havana in
// November). A date a zone skips (Pacific/Apia, 2011-12-30) is a window of
// no length: its Rate comes with the next. The windows depend only on the
// zone's rules (Go's tzdata) and the instant.
type Calendar struct {
	Unit    CalendarUnit
	Weekday time.Weekday // the first day of a Week window
	// Location is the time zone of the windows. nil is UTC.
	Location *time.Location
}

// calendar reports whether c's windows are calendar units.
func (c Config) calendar() bool { return c.Kind == FixedWindow && c.Calendar.Unit != 0 }

// Window returns the calendar window that holds the instant t: start <= t
// < end, both in µs since the epoch.
func (cal Calendar) Window(t int64) (start, end int64) {
	i, start := cal.window(t)
	return start, cal.start(i + 1)
}

// window returns the index of the window that holds t (one more is the
// next window) and its start.
func (cal Calendar) window(t int64) (int64, int64) {
	y, m, d := time.UnixMicro(t).In(cal.location()).Date()
	i := cal.index(y, m, d)
	start := cal.start(i)
	// t's local date is at or after the first day of window i, so window
	// i starts at or before t; a later window may too, when the clocks
	// turned back across its first midnight.
	for {
		next := cal.start(i + 1)
		if next > t {
			return i, start
		}
		i, start = i+1, next
	}
}

func (cal Calendar) location() *time.Location {
	if cal.Location == nil {
		return time.UTC
	}
	return cal.Location
}

const dayMicros = 24 * 60 * 60 * 1_000_000

// index returns the index of the window whose first day is on or before the
// date y-m-d and whose next window's first day is after it.
func (cal Calendar) index(y int, m time.Month, d int) int64 {
	switch cal.Unit {
	case Day:
		return civilDay(y, m, d)
	case Week:
		// Day 0 (1970-01-01) was a Thursday: day i is weekday (i+4) mod 7,
		// so weeks of first weekday w start where i+4-w is a multiple of 7.
		return floorDiv(civilDay(y, m, d)+4-int64(cal.Weekday), 7)
	case Month:
		return int64(y)*12 + int64(m) - 1
	default:
		return int64(y)
	}
}

// start returns the instant window i starts: the earliest instant whose
// local date and time is at or after midnight of its first day.
func (cal Calendar) start(i int64) int64 {
	var wall int64 // midnight of the first day, as µs of a clock on UTC
	switch cal.Unit {
	case Day:
		wall = i * dayMicros
	case Week:
		wall = (7*i - 4 + int64(cal.Weekday)) * dayMicros
	case Month:
		wall = time.Date(int(floorDiv(i, 12)), time.Month(floorMod(i, 12)+1), 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	default:
		wall = time.Date(int(i), time.January, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	}
	return firstAtOrAfter(cal.location(), wall)
}

// firstAtOrAfter returns the earliest instant whose local time in loc, read
// as µs of a clock on UTC, is at least wall. It walks the zone's periods
// (each with one UTC offset) from a day before, which no offset can have
// reached yet, to the first that reaches wall: the instant its offset reads
// wall, or its start when the clocks jumped over wall into it.
func firstAtOrAfter(loc *time.Location, wall int64) int64 {
	t := wall - dayMicros
	for {
		at := time.UnixMicro(t).In(loc)
		_, offset := at.Zone()
		reads := max(wall-int64(offset)*1_000_000, t)
		end, ok := zoneEnd(at)
		if !ok || reads < end {
			return reads
		}
		t = end
	}
}

// zoneEnd returns when the period of the zone in effect at at ends, or
// false when it never does. Past the zone's last transition (2037),
// ZoneBounds on December 31 of a leap year ends the period before at (Go
// 1.26); its offset is right, so it is taken to run to the next UTC year.
func zoneEnd(at time.Time) (int64, bool) {
	_, end := at.ZoneBounds()
	switch {
	case end.IsZero():
		return 0, false
	case end.After(at):
		return end.UnixMicro(), true
	}
	return time.Date(at.UTC().Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), true
}

// afterLimit is, per unit, a count of windows that reaches past MaxWait
// (about 53,300 days).
var afterLimit = [...]float64{Day: 60_000, Week: 9_000, Month: 1_800, Year: 150}

// after returns the start of the window n (at least 1) windows after the
// one that holds t. A count that would reach past MaxWait (and a NaN) is
// capped, which keeps the dates in range: the caller clamps the wait.
func (cal Calendar) after(t int64, n float64) int64 {
	if limit := afterLimit[cal.Unit]; !(n < limit) { // a NaN too: MaxWait
		n = limit
	}
	i, _ := cal.window(t)
	return cal.start(i + int64(n))
}

// projectCalendar is Project for a FixedWindow with calendar windows. Its
// TS is the instant of the state's last write (or a read's), not the start
// of its window: a window that holds it has started, and no other, so the
// decisions are the same; but under another calendar (a Zone, WeekStart or
// unit changed since the row was written) the Rate of a new window comes
// only at the first new boundary after the last write, never mid-window
// for a key that took under the old calendar (docs/config-changes.md). A
// row written when TS was a window's start reads as written then.
func projectCalendar(c Config, s State, now int64) State {
	if now <= s.TS {
		return State{Value: math.Min(s.Value, c.Capacity), TS: s.TS}
	}
	was, _ := c.Calendar.window(s.TS)
	is, _ := c.Calendar.window(now)
	v := s.Value
	if is > was {
		v += c.Rate * float64(is-was)
	}
	return State{Value: math.Min(v, c.Capacity), TS: now}
}

// civilDay returns the number of days from 1970-01-01 to y-m-d.
func civilDay(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / (24 * 60 * 60)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
