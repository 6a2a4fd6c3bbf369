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
	// the time since the current one started. The weight is exact, so a
	// limit never resets early, and a denied call counts nothing: after 10
	// calls at 12:00:59 under 10 per minute, a call at 12:01:01 is denied.
	//
	// Worst case: when the previous window's calls all came at its end, a
	// window of Period straddling the boundary admits them and nearly all of
	// the next window's: with Capacity b and Rate r, any span of length L
	// admits at most b + min(r, b)·(L - 1µs)/Period, reservations aside;
	// just under 2·Rate for L = Period and the default b = r. Capacity r/2
	// bounds every window of Period at r (docs/windows.md). Its state is
	// counts, not tokens: convert a limit's keys (txlimit change) or Reset
	// them when its Kind changes to or from SlidingWindow
	// (docs/config-changes.md).
	SlidingWindow Kind = Kind(algo.SlidingWindow)

	// Daily, Weekly, Monthly and Yearly are fixed windows of the calendar
	// in Config.Zone, which they require: "10,000 a month, reset on the 1st
	// at midnight in the customer's zone". Rate tokens come at the start of
	// each window; unused ones roll over up to Capacity, and a raised Rate
	// arrives with the next window (Credit the difference to apply it at
	// once). A window starts at local midnight of its first day
	// (Config.WeekStart, the 1st of a month, January 1st), so a day lasts 23
	// to 25 hours across daylight saving changes; where the clocks skip
	// midnight it starts when they jump, where midnight comes twice, at the
	// first. Go's time zone rules decide (import time/tzdata on a machine
	// without them). Period must be 0.
	Daily   Kind = 4
	Weekly  Kind = 5
	Monthly Kind = 6
	Yearly  Kind = 7
)

// calendar is the calendar unit of a calendar kind, and 0 for the others:
// Daily to Yearly are algo.Day to algo.Year, in order.
func (k Kind) calendar() algo.CalendarUnit {
	if k < Daily || k > Yearly {
		return 0
	}
	return algo.Day + algo.CalendarUnit(k-Daily)
}

// kindNames are the Kinds as errors name them.
var kindNames = [...]string{
	TokenBucket:   "TokenBucket",
	FixedWindow:   "FixedWindow",
	SlidingWindow: "SlidingWindow",
	Daily:         "Daily",
	Weekly:        "Weekly",
	Monthly:       "Monthly",
	Yearly:        "Yearly",
	Concurrency:   "Concurrency",
}

func (k Kind) name() string {
	if k >= TokenBucket && k <= Yearly || k == Concurrency {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// maxShards is the largest Shards a Config may have.
const maxShards = 1024

// Config defines one limit. The fields after MaxReserved belong to features
// that are off by default: hot keys before the work (Shards,
// ReportRemaining), the alignment of windows (Start, Zone, WeekStart) and
// hot keys at commit (Lease, LeaseFor, LeaseAhead). A field set where it
// does not apply is an *InvalidError that says which field goes with it.
//
// A changed Config reads the state its keys already have: each key keeps
// its tokens, capped at the new Capacity, and refills by the new rule from
// the instant its row records; docs/config-changes.md says what each
// field's change does, and txlimit change (cmd/txlimit) previews it and
// converts the keys.
type Config struct {
	// Kind is the refill rule: TokenBucket, FixedWindow, SlidingWindow,
	// or a calendar window (Daily, Weekly, Monthly, Yearly); or
	// Concurrency, at most Capacity holders at once (with HoldFor).
	// Required.
	Kind Kind
	// Rate is the number of tokens added per Period (per window for a
	// calendar Kind). Required, > 0.
	Rate float64
	// Period is the time over which Rate tokens are added: at least one
	// microsecond, the precision of the state, or 0 for a calendar Kind.
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
	// before the work (docs/hot-keys.md). Each shard holds a Shards-th of
	// Rate, Capacity and MaxReserved, and the limit never admits more than
	// one unsharded limit would. Defaults to 1; at most 1024. Give a hot
	// limit about as many shards as transactions hold it at once, and keep
	// Capacity/Shards several times the count of one call.
	Shards int
	// ReportRemaining makes every call on a sharded limit report
	// Result.Remaining and NextToken, which a call served from one free
	// shard otherwise leaves unknown (Result.Partial), by reading every shard
	// in the statement that takes its own (more work on the hottest path).
	// Set it for a limit whose Remaining is shown (httplimit's RateLimit
	// header). Shards > 1 only: an unsharded limit always reports
	// Remaining. Defaults to false.
	ReportRemaining bool

	// Start aligns the windows of a FixedWindow or SlidingWindow to Start
	// plus whole multiples of Period. When zero, each (name, key) gets a
	// stable offset in [0, Period) from a hash of the two, which spreads the
	// resets of many keys over the period.
	Start time.Time
	// Zone is the IANA time zone of a calendar Kind's windows, such as
	// "Europe/Berlin", or "UTC". Required for a calendar Kind, so that a
	// quota resets at the midnight its users expect; "Local" is refused:
	// machines would disagree on the windows.
	Zone string
	// WeekStart is the first day of a Weekly window. Defaults to Sunday
	// (time.Weekday's zero value); time.Monday for ISO 8601 weeks.
	WeekStart time.Weekday

	// Lease lets Limiter.Commit hand this limit's tokens out from memory:
	// the answer for a hot key at commit (docs/hot-keys.md). The Limiter
	// takes up to Lease tokens of a key at once, in a short transaction of
	// its own, and hands them out one call at a time, so that a hot key's
	// row is written once per lease, not once per call; a call whose
	// transaction does not commit gives its tokens back to the lease. A
	// lease ends LeaseFor after it was taken, or with its FixedWindow's
	// window; what it has not handed out is credited back at the next call
	// for its key or at ReturnLeases, if that comes within LeaseFor (or the
	// window), and dropped otherwise. Every admission spends a token the
	// limit gave within the last LeaseFor, once; the limit admits less while
	// tokens are parked, by at most Lease per process and key (more with
	// LeaseAhead; docs/commit.md). TokenBucket and FixedWindow only. The
	// other forms take from the limit's rows: only Commit sees the outcome
	// of the transaction it ends. Defaults to 0: no lease.
	Lease float64
	// LeaseFor is how long a lease lasts at most. Defaults to one second
	// when Lease is set; needs Lease.
	LeaseFor time.Duration
	// LeaseAhead takes the next lease of a key in the background once the
	// one held has fewer than LeaseAhead tokens left, so that a hot key's
	// callers never queue behind its row; it keeps its own end, serves once
	// the one held is spent or over, and if its take fails, the next call
	// takes a lease itself. A Limiter then parks up to Lease + LeaseAhead
	// tokens of a key, and up to two leases' worth counting those in open
	// transactions (docs/commit.md). At most Lease; needs Lease. Defaults to
	// 0: the call that finds the lease empty takes the next, while the
	// others wait.
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

// normalized fills the defaults of the features in use and validates c.
// name is only used in errors.
func (c Config) normalized(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, invalid(name, field, problem, args...)
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
		if err := c.calendar(name); err != nil {
			return Config{}, err
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
	// LeaseAhead may equal Lease, not exceed it: a slice holds at most Lease
	// once it has handed a token out, so LeaseAhead = Lease already takes
	// the next slice at a slice's first call.
	switch {
	case c.Lease != 0 && (!finite(c.Lease) || c.Lease < 0):
		return bad("Lease", "must be a finite number of tokens >= 0 (0: no lease), got %v", c.Lease)
	case c.Lease > c.Capacity:
		return bad("Lease", "exceeds Capacity: a lease takes at most what the limit holds, got %v", c.Lease)
	case c.Lease != 0 && c.Kind != TokenBucket && c.Kind != FixedWindow:
		return bad("Lease", "applies to TokenBucket and FixedWindow limits, whose tokens a lease can hold, not to a %v, got %v",
			c.Kind.name(), c.Lease)
	case c.LeaseAhead != 0 && (!finite(c.LeaseAhead) || c.LeaseAhead < 0):
		return bad("LeaseAhead", "must be a finite number of tokens >= 0 (0: the next lease is taken when the lease runs out), got %v",
			c.LeaseAhead)
	case c.LeaseAhead != 0 && c.Lease == 0:
		return bad("LeaseAhead", "needs Lease: it is how low a lease runs before the next one is taken; set Lease too, "+
			"or leave LeaseAhead 0, got %v", c.LeaseAhead)
	case c.LeaseAhead > c.Lease:
		return bad("LeaseAhead", "exceeds Lease (%v): LeaseAhead = Lease already takes the next lease at a lease's first call; "+
			"set at most Lease, such as Lease/2, got %v", c.Lease, c.LeaseAhead)
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
func (c *Config) calendar(name string) error {
	bad := func(field, problem string, args ...any) error { return invalid(name, field, problem, args...) }
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
