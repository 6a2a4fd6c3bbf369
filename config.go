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
	// up to Capacity.
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

	// Daily, Weekly, Monthly and Yearly are fixed windows of the calendar
	// in Config.Zone, which they require: "100 a day", "10,000 a month,
	// reset on the 1st at midnight in the customer's zone". Rate tokens
	// come at the start of each window, up to Capacity; unused ones roll
	// over up to Capacity, as in every FixedWindow, and a raised Rate
	// arrives with the next window (Credit the difference to apply it at
	// once). A window starts at local midnight of its first day (a Weekly
	// window's Config.WeekStart, the 1st of a month, January 1st): a day
	// lasts 23 to 25 hours across daylight saving changes, and a month 28
	// to 31 days; where the clocks skip midnight the window starts when
	// they jump, where midnight comes twice, at the first. The boundaries
	// are computed from the database's clock with Go's time zone rules
	// (import time/tzdata on a machine without them). Period must be 0.
	Daily   Kind = 4
	Weekly  Kind = 5
	Monthly Kind = 6
	Yearly  Kind = 7
)

// calendar is the calendar unit of a calendar kind, and 0 for the others.
func (k Kind) calendar() algo.CalendarUnit {
	switch k {
	case Daily:
		return algo.Day
	case Weekly:
		return algo.Week
	case Monthly:
		return algo.Month
	case Yearly:
		return algo.Year
	}
	return 0
}

// name is k as errors name it.
func (k Kind) name() string {
	switch k {
	case TokenBucket:
		return "TokenBucket"
	case FixedWindow:
		return "FixedWindow"
	case SlidingWindow:
		return "SlidingWindow"
	case Daily:
		return "Daily"
	case Weekly:
		return "Weekly"
	case Monthly:
		return "Monthly"
	case Yearly:
		return "Yearly"
	case Concurrency:
		return "Concurrency"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// maxWait is the longest wait a Result reports: half the range of
// time.Duration, about 146 years (2^62 ns, in whole microseconds), so that
// adding a jitter or a period to it cannot overflow. A denial whose wait is
// longer says RetryAfter = maxWait; a reservation whose wait would reach it
// is refused with an *InvalidError for its Count, and nothing is taken.
const maxWait = time.Duration(algo.MaxWait) * time.Microsecond

// maxShards is the largest Shards a Config may have.
const maxShards = 1024

// Config defines one limit. The fields after MaxReserved belong to
// features that are off by default: hot keys before the work (Shards,
// ReportRemaining), the alignment of windows (Start, Zone, WeekStart) and
// hot keys at commit (Lease, LeaseFor, LeaseAhead). A field set where it
// does not apply is an *InvalidError that says which field goes with it.
type Config struct {
	// Kind is the refill rule: TokenBucket, FixedWindow, SlidingWindow,
	// or a calendar window (Daily, Weekly, Monthly, Yearly); or
	// Concurrency, at most Capacity holders at once (with HoldFor).
	// Required.
	Kind Kind
	// Rate is the number of tokens added per Period (per calendar window
	// for a calendar Kind). Required, > 0.
	Rate float64
	// Period is the time over which Rate tokens are added. Required, at
	// least one microsecond (state is kept at microsecond precision), but
	// for a calendar Kind, where it must be 0.
	Period time.Duration
	// Capacity is the most tokens the limit holds: the largest burst.
	// Defaults to Rate. For a Concurrency limit, the most holders at once:
	// required, a whole number >= 1.
	Capacity float64
	// MaxReserved caps how deep a reservation (the Reserve option) may put
	// the limit into debt. Defaults to 0, which means no cap.
	MaxReserved float64

	// Shards spreads the limit over this many rows so that concurrent
	// transactions do not queue on one row lock: the answer for a hot key
	// before the work (docs/hot-keys.md). Each shard holds Rate/Shards,
	// Capacity/Shards and MaxReserved/Shards, and the limit never admits
	// more than one unsharded limit would. Defaults to 1; at most 1024. A
	// row is held until its transaction commits, so give a hot limit about
	// as many shards as transactions hold it at once, and keep
	// Capacity/Shards several times the count of one call.
	Shards int
	// ReportRemaining makes every call on a sharded limit report
	// Result.Remaining and NextToken, which a call that PostgreSQL serves
	// from one free shard otherwise leaves unknown (Result.Partial): such a
	// call then reads every shard, in the statement that takes its shard
	// (no extra round trip, but more work on the hottest path). Set it for
	// a limit whose Remaining is shown, such as one behind httplimit's
	// RateLimit header. Sharded limits only (Shards > 1): an unsharded
	// limit always reports Remaining. Defaults to false.
	ReportRemaining bool

	// Start aligns the windows of a FixedWindow or SlidingWindow: windows
	// begin at Start plus whole multiples of Period. When zero, each
	// (name, key) gets a stable offset in [0, Period) derived from a hash
	// of the two, which spreads the resets of many keys over the period.
	Start time.Time
	// Zone is the IANA time zone of a calendar Kind's windows, such as
	// "Europe/Berlin", or "UTC". Required for Daily, Weekly, Monthly and
	// Yearly, so that a quota resets at the midnight its users expect;
	// "Local" is refused: machines would disagree on the windows.
	Zone string
	// WeekStart is the first day of a Weekly window. Defaults to Sunday
	// (time.Weekday's zero value); time.Monday for ISO 8601 weeks.
	WeekStart time.Weekday

	// Lease lets Limiter.Commit hand this limit's tokens out from memory:
	// the answer for a hot key at commit (docs/hot-keys.md). The Limiter
	// takes up to Lease tokens of a key at once, in a short transaction of
	// its own, and gives them to its callers one call at a time, so that a
	// hot key's row is written once per lease rather than once per call.
	// A call whose transaction does not commit gives its tokens back to the
	// lease. A lease ends LeaseFor after it was taken, or with the window
	// its tokens came from (FixedWindow); what it has not handed out goes
	// back to the limit (Credit) at the next call for its key or at
	// ReturnLeases, if that comes within LeaseFor (a FixedWindow's: within
	// the window), and is dropped otherwise. Every admission spends a token
	// the limit gave within the last LeaseFor, once; the limit admits less
	// while tokens are parked, by at most Lease per process and key (more
	// with LeaseAhead; docs/commit.md). TokenBucket and FixedWindow only.
	// The other forms (LimitTx, CommitTx, ...) take from the limit's rows:
	// only Commit sees the outcome of the transaction it ends before the
	// tokens could be lost. Defaults to 0: no lease.
	Lease float64
	// LeaseFor is how long a lease lasts at most. Defaults to one second
	// when Lease is set; needs Lease.
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

	// HoldFor is how long a holder of a Concurrency limit keeps its slot
	// without Extend: the slot of a holder whose process died comes back
	// HoldFor after it was acquired or last extended. At no instant do
	// more than Capacity unexpired holders exist; a holder still working
	// past its expiry can see a second holder admitted beside it, so
	// choose HoldFor well above the work's usual duration, or Extend every
	// HoldFor/3 while the work runs and stop the work when Extend returns
	// false. Required for Concurrency, at least 1ms; refused for the other
	// kinds.
	HoldFor time.Duration

	// loc is Zone, loaded by normalized.
	loc *time.Location
}

// normalized fills defaults and validates c: the normalized Config holds
// the defaults of the features in use and leaves the others zero. name is
// only used in errors.
func (c Config) normalized(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, &InvalidError{Limit: name, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	if c.Kind == Concurrency {
		return c.concurrency(name)
	}
	if c.Kind < TokenBucket || c.Kind > Yearly {
		return bad("Kind", "must be txlimit.TokenBucket, FixedWindow, SlidingWindow, Daily, Weekly, Monthly, Yearly or Concurrency, got %d", uint8(c.Kind))
	}
	if c.HoldFor != 0 {
		return bad("HoldFor", "applies to Concurrency limits only (how long a holder keeps its slot); leave it 0 for a %v", c.Kind.name())
	}
	if !finite(c.Rate) || c.Rate <= 0 {
		return bad("Rate", "must be a finite number > 0, got %v", c.Rate)
	}
	if c.Kind.calendar() != 0 {
		if err := c.calendar(); err != nil {
			return Config{}, &InvalidError{Limit: name, Field: err.Field, Problem: err.Problem}
		}
	} else {
		switch {
		case c.Period < time.Microsecond:
			return bad("Period", "must be at least 1µs, got %v", c.Period)
		case c.Zone != "":
			return bad("Zone", "applies to the calendar kinds (Daily, Weekly, Monthly, Yearly), not to a %v: "+
				"leave it empty, or make the Kind a calendar one", c.Kind.name())
		case c.WeekStart != time.Sunday:
			return bad("WeekStart", "applies to Weekly limits only; leave it zero for a %v", c.Kind.name())
		case c.Kind == TokenBucket && !c.Start.IsZero():
			return bad("Start", "applies to FixedWindow and SlidingWindow only; leave it zero for a TokenBucket")
		}
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
	if c.ReportRemaining && c.Shards == 1 {
		return bad("ReportRemaining", "applies to sharded limits (Shards > 1), whose calls may read one shard only; "+
			"an unsharded limit always reports Remaining: leave it false, or set Shards")
	}
	if problem := c.leaseProblem(); problem != "" {
		return bad("Lease", "%v, got %v", problem, c.Lease)
	}
	if problem := c.leaseAheadProblem(); problem != "" {
		return bad("LeaseAhead", "%v, got %v", problem, c.LeaseAhead)
	}
	switch {
	case c.LeaseFor < 0:
		return bad("LeaseFor", "must be >= 0 (0 means one second, with Lease), got %v", c.LeaseFor)
	case c.LeaseFor > 0 && c.Lease == 0:
		return bad("LeaseFor", "is how long a lease lasts, and needs Lease: set Lease too, or leave LeaseFor 0")
	case c.LeaseFor == 0 && c.Lease > 0:
		c.LeaseFor = defaultLeaseFor
	}
	c.Period = c.Period.Truncate(time.Microsecond)
	return c, nil
}

// calendar validates the fields of a calendar Kind and loads its Zone.
func (c *Config) calendar() *InvalidError {
	bad := func(field, problem string, args ...any) *InvalidError {
		return &InvalidError{Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	switch {
	case c.Period != 0:
		return bad("Period", "must be 0 for a %v limit (its window is the calendar's), got %v", c.Kind.name(), c.Period)
	case !c.Start.IsZero():
		return bad("Start", "aligns windows of Period; a %v limit is aligned to the calendar in its Zone: leave Start zero", c.Kind.name())
	case c.WeekStart < time.Sunday || c.WeekStart > time.Saturday:
		return bad("WeekStart", "must be a time.Weekday (Sunday to Saturday), got %d", c.WeekStart)
	case c.WeekStart != time.Sunday && c.Kind != Weekly:
		return bad("WeekStart", "applies to Weekly limits only; leave it zero for a %v", c.Kind.name())
	case c.Zone == "":
		return bad("Zone", "is required for a %v limit, whose windows start at midnight in that zone: "+
			"say \"UTC\" for UTC, or an IANA name such as \"Europe/Berlin\"", c.Kind.name())
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

// stored is c as a store sees it, for every key.
func (c Config) stored() driver.LimitConfig {
	kind := algo.Kind(c.Kind)
	if c.Kind.calendar() != 0 {
		kind = algo.FixedWindow
	}
	return driver.LimitConfig{
		Config: algo.Config{
			Kind: kind, Rate: c.Rate, Period: c.Period.Microseconds(),
			Capacity: c.Capacity, MaxReserved: c.MaxReserved,
			Calendar: algo.Calendar{Unit: c.Kind.calendar(), Weekday: c.WeekStart, Location: c.loc},
		},
		Shards: c.Shards, Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
	}
}
