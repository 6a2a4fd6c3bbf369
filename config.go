package txlimit

import (
	"fmt"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Kind is the refill rule of a limit.
type Kind uint8

const (
	// TokenBucket adds Rate tokens per Period continuously, up to Capacity.
	TokenBucket Kind = Kind(algo.TokenBucket)
	// FixedWindow adds Rate tokens at the start of each window of Period,
	// or of each calendar Day, Week, Month or Year (Config.Calendar), up to
	// Capacity.
	FixedWindow Kind = Kind(algo.FixedWindow)
	// SlidingWindow admits at most Rate in a window of Period that slides
	// with the clock, by the sliding window counter: a call is admitted
	// when
	//
	//	prev·(1 - elapsed/Period) + curr + count <= Rate
	//
	// where curr is what the current window of Period (aligned as a
	// FixedWindow's) has taken, prev what the previous one took and elapsed
	// the time since the current one started. The weight is exact, never
	// rounded down, so a limit never resets early, and a denied call
	// counts nothing. After 10 calls at 12:00:59 under 10 per minute, a
	// call at 12:01:01 is denied (a FixedWindow would admit 10 more).
	//
	// Worst case: the weighting assumes the previous window's calls were
	// spread over it. When they all came at its end, a window of Period
	// straddling the boundary admits them and nearly all of the next
	// window's: with Capacity b and Rate r, any span of length L admits at
	// most b + min(r, b)·(L - 1µs)/Period, reservations aside; for
	// L = Period and the default b = r, just under 2·Rate. A tighter bound
	// costs burst size, not state: Capacity r/2 bounds every window of
	// Period at r (admitting r/2 per Period). docs/windows.md compares the
	// window shapes.
	//
	// The state of a sliding window is counts, not tokens: Reset a limit's
	// keys when its Kind changes to or from SlidingWindow.
	SlidingWindow Kind = Kind(algo.SlidingWindow)
)

func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "token bucket"
	case FixedWindow:
		return "fixed window"
	case SlidingWindow:
		return "sliding window"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// CalendarUnit is the length of the windows of a calendar window
// (Config.Calendar): a FixedWindow whose windows are calendar days, weeks,
// months or years in a time zone.
type CalendarUnit uint8

// The calendar units. A window starts at local midnight of its first day
// (a Week's Config.WeekStart, the 1st of a Month, January 1st) in
// Config.Zone: a day lasts 23 to 25 hours across daylight saving changes,
// and a month 28 to 31 days. Where the clocks skip midnight the window
// starts when they jump; where midnight comes twice, at the first.
const (
	Day   CalendarUnit = CalendarUnit(algo.Day)
	Week  CalendarUnit = CalendarUnit(algo.Week)
	Month CalendarUnit = CalendarUnit(algo.Month)
	Year  CalendarUnit = CalendarUnit(algo.Year)
)

// MaxWait is the longest wait a Result reports: half the range of
// time.Duration, about 146 years (2^62 ns, in whole microseconds), so that
// adding a jitter or a period to it cannot overflow. A denial whose wait is
// longer (a Rate of 1e-300, a Period of a century with a large count) says
// RetryAfter = MaxWait; a reservation whose wait would reach it is refused
// with an *InvalidError for its Count, and nothing is taken.
const MaxWait = time.Duration(algo.MaxWait) * time.Microsecond

// maxShards is the largest Shards a Config may have.
const maxShards = 1024

// Config defines one limit.
type Config struct {
	// Kind is TokenBucket, FixedWindow or SlidingWindow. Required.
	Kind Kind
	// Rate is the number of tokens added per Period (per calendar window
	// for Calendar). Required, > 0.
	Rate float64
	// Period is the time over which Rate tokens are added. Required, at
	// least one microsecond (state is kept at microsecond precision), but
	// for a calendar window, where it must be 0.
	Period time.Duration
	// Capacity is the most tokens the limit holds: the largest burst.
	// Defaults to Rate.
	Capacity float64
	// MaxReserved caps how deep a reservation (the Reserve option) may put
	// the limit into debt. Defaults to 0, which means no cap.
	MaxReserved float64
	// Shards spreads the limit over this many rows so that concurrent
	// transactions do not queue on one row lock. Each shard holds
	// Rate/Shards, Capacity/Shards and MaxReserved/Shards. Defaults to 1;
	// at most 1024. A row is held until its transaction commits, so
	// give a hot limit about as many shards as transactions hold it at
	// once, and keep Capacity/Shards several times the count of one call
	// (docs/sharding.md).
	Shards int
	// Start aligns the windows of a FixedWindow limit: windows begin at
	// Start plus whole multiples of Period. When zero, each (name, key) gets
	// a stable offset in [0, Period) derived from a hash of the two, which
	// spreads the resets of many keys over the period. Must be zero for a
	// TokenBucket.
	Start time.Time
	// Calendar makes a FixedWindow's windows calendar units (Day, Week,
	// Month, Year) in Zone, with Period 0: "100 a day", "10,000 a month,
	// reset on the 1st at midnight in the customer's zone". Unused Rate
	// rolls over up to Capacity, as in every FixedWindow; a raised Rate
	// arrives with the next window (Credit the difference to apply it at
	// once). The boundaries are computed from the database's clock with
	// Go's time zone rules (import time/tzdata on a machine without
	// them). Defaults to 0: windows of Period.
	Calendar CalendarUnit
	// Zone is the IANA time zone of the calendar windows, such as
	// "Europe/Berlin". Defaults to "" (UTC). "Local" is refused: machines
	// would disagree on the windows.
	Zone string
	// WeekStart is the first day of a Week window. Defaults to Sunday
	// (time.Weekday's zero value); time.Monday for ISO 8601 weeks.
	WeekStart time.Weekday
	// Lease lets BeginFunc hand this limit's tokens out from memory: the Limiter takes up to Lease tokens of a
	// key at once, in a short transaction of its own, and gives them to
	// its callers one call at a time, so that a hot key's row is written
	// once per lease rather than once per call. A call whose transaction
	// does not commit gives its tokens back to the lease. A lease ends
	// LeaseFor after it was taken, or with the window its tokens came from
	// (FixedWindow); what it has not handed out goes back to the limit
	// (Credit) at the next call for its key or at ReturnLeases, if that
	// comes within LeaseFor (a FixedWindow's: within the window), and is
	// dropped otherwise. Every admission spends a token the limit gave
	// within the last LeaseFor, once; the limit admits less while tokens
	// are parked, by at most Lease per process and key (more with
	// LeaseAhead; docs/commit.md). TokenBucket and FixedWindow windows of Period
	// only; LimitTx, CommitTx and the other forms take
	// from the limit itself. Defaults to 0: no lease.
	Lease float64
	// LeaseFor is how long a lease lasts at most. Defaults to one second.
	LeaseFor time.Duration
	// LeaseAhead takes the next lease of a key in the background once the
	// one held has fewer than LeaseAhead tokens left, so that the calls
	// that find it empty need not wait for the take: a hot key's callers
	// then never queue behind its row. The lease taken ahead keeps its own
	// end and is handed out once the one held is spent or over; a take
	// ahead that fails only leaves the next call to take a lease itself.
	// A Limiter then parks up to Lease + LeaseAhead tokens of a key rather
	// than Lease, and up to two leases' worth counting those out in open
	// transactions (docs/commit.md). At most Lease; needs Lease. Defaults
	// to 0: the next lease is taken by the call that finds the lease
	// empty, while the key's other callers wait.
	LeaseAhead float64

	// loc is Zone, loaded by normalized.
	loc *time.Location
}

// normalized fills defaults and validates c. name is only used in errors.
func (c Config) normalized(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, &InvalidError{Limit: name, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	if c.Kind != TokenBucket && c.Kind != FixedWindow && c.Kind != SlidingWindow {
		return bad("Kind", "must be txlimit.TokenBucket, txlimit.FixedWindow or txlimit.SlidingWindow, got %v", c.Kind)
	}
	if !finite(c.Rate) || c.Rate <= 0 {
		return bad("Rate", "must be a finite number > 0, got %v", c.Rate)
	}
	if c.Calendar != 0 {
		if err := c.calendar(); err != nil {
			return Config{}, &InvalidError{Limit: name, Field: err.Field, Problem: err.Problem}
		}
	} else if c.Period < time.Microsecond {
		return bad("Period", "must be at least 1µs, got %v", c.Period)
	}
	if c.Capacity == 0 {
		c.Capacity = c.Rate
	}
	if !finite(c.Capacity) || c.Capacity < 0 {
		return bad("Capacity", "must be a finite number > 0 (or 0 for the default, Rate), got %v", c.Capacity)
	}
	if !finite(c.MaxReserved) || c.MaxReserved < 0 {
		return bad("MaxReserved", "must be a finite number >= 0 (0 means no cap), got %v", c.MaxReserved)
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shards < 1 || c.Shards > maxShards {
		return bad("Shards", "must be between 1 and %d (0 means 1), got %d", maxShards, c.Shards)
	}
	if c.Kind == TokenBucket && !c.Start.IsZero() {
		return bad("Start", "applies to FixedWindow and SlidingWindow only; leave it zero for a TokenBucket")
	}
	if problem := c.leaseProblem(); problem != "" {
		return bad("Lease", "%v, got %v", problem, c.Lease)
	}
	if problem := c.leaseAheadProblem(); problem != "" {
		return bad("LeaseAhead", "%v, got %v", problem, c.LeaseAhead)
	}
	if c.LeaseFor < 0 {
		return bad("LeaseFor", "must be >= 0 (0 means one second), got %v", c.LeaseFor)
	}
	if c.LeaseFor == 0 {
		c.LeaseFor = defaultLeaseFor
	}
	c.Period = c.Period.Truncate(time.Microsecond)
	return c, nil
}

// calendar validates the calendar window fields of c and loads its Zone.
func (c *Config) calendar() *InvalidError {
	bad := func(field, problem string, args ...any) *InvalidError {
		return &InvalidError{Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	switch {
	case c.Calendar < Day || c.Calendar > Year:
		return bad("Calendar", "must be txlimit.Day, txlimit.Week, txlimit.Month or txlimit.Year (or 0 for windows of Period), got %d", c.Calendar)
	case c.Kind != FixedWindow:
		return bad("Calendar", "applies to FixedWindow only, got a %v; a calendar window is a FixedWindow whose windows are days, weeks, months or years", c.Kind)
	case c.Period != 0:
		return bad("Period", "must be 0 for a calendar window (its Calendar unit is the period), got %v", c.Period)
	case !c.Start.IsZero():
		return bad("Start", "aligns windows of Period; a calendar window is aligned to the calendar: leave Start zero")
	case c.WeekStart < time.Sunday || c.WeekStart > time.Saturday:
		return bad("WeekStart", "must be a time.Weekday (Sunday to Saturday), got %d", c.WeekStart)
	case c.WeekStart != time.Sunday && c.Calendar != Week:
		return bad("WeekStart", "applies to Week windows only; leave it zero")
	case c.Zone == "Local":
		return bad("Zone", "must name a zone: \"Local\" is each machine's own, and machines would disagree on the windows")
	}
	loc, err := time.LoadLocation(c.Zone)
	if err != nil {
		return bad("Zone", "%q is not a time zone this program knows (%v); use an IANA name such as \"Europe/Berlin\", and import time/tzdata if the machine has no tzdata", c.Zone, err)
	}
	c.loc = loc
	return nil
}

// describe names c's kind of window, for errors.
func (c Config) describe() string {
	if c.Calendar != 0 {
		return "calendar window"
	}
	return c.Kind.String()
}

// stored is c as a store sees it, for every key.
func (c Config) stored() driver.LimitConfig {
	return driver.LimitConfig{
		Config: algo.Config{
			Kind: algo.Kind(c.Kind), Rate: c.Rate, Period: c.Period.Microseconds(),
			Capacity: c.Capacity, MaxReserved: c.MaxReserved,
			Calendar: algo.Calendar{Unit: algo.CalendarUnit(c.Calendar), Weekday: c.WeekStart, Location: c.loc},
		},
		Shards: c.Shards, Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
	}
}
