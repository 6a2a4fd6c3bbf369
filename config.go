package txlimit

import (
	"fmt"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
)

// Kind is the refill rule of a limit.
type Kind uint8

const (
	// TokenBucket adds Rate tokens per Period continuously, up to Capacity.
	TokenBucket Kind = Kind(algo.TokenBucket)
	// FixedWindow adds Rate tokens at the start of each window of Period,
	// up to Capacity.
	FixedWindow Kind = Kind(algo.FixedWindow)
)

func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "token bucket"
	case FixedWindow:
		return "fixed window"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

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
	// Kind is TokenBucket or FixedWindow. Required.
	Kind Kind
	// Rate is the number of tokens added per Period. Required, > 0.
	Rate float64
	// Period is the time over which Rate tokens are added. Required, at
	// least one microsecond (state is kept at microsecond precision).
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
	// Escrow takes the tokens at once, outside the caller's transaction,
	// and only escrows them until it ends: kept if it commits, given back
	// by settlement if it does not. The limit's row is then locked only for
	// one statement, never until the caller commits, so one hot key no
	// longer queues its callers. The price: the tokens of a caller that
	// rolls back come back late (at the next call of the key that would be
	// denied without them, or at the next settlement: pgstore settles in
	// the background about once a second while escrow calls are made, and
	// Limiter.Settle settles on demand), never early. An escrow limit has
	// one shard (Shards must be 0 or 1). LimitAllTx takes escrow limits
	// first and cancels them when another limit denies. PostgreSQL
	// (pgstore, with a pool) only; run Limiter.Settle every few seconds for
	// the calls left when the calls stop. Limit and LimitAll (the forms
	// without Tx) take an escrow limit in their own short transaction, as
	// the locked model does. See docs/escrow.md.
	// Defaults to false: the row is locked until the caller's transaction
	// ends.
	Escrow bool
}

// normalized fills defaults and validates c. name is only used in errors.
func (c Config) normalized(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, &InvalidError{Limit: name, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	if c.Kind != TokenBucket && c.Kind != FixedWindow {
		return bad("Kind", "must be txlimit.TokenBucket or txlimit.FixedWindow, got %v", c.Kind)
	}
	if !finite(c.Rate) || c.Rate <= 0 {
		return bad("Rate", "must be a finite number > 0, got %v", c.Rate)
	}
	if c.Period < time.Microsecond {
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
	if c.Escrow && c.Shards > 1 {
		return bad("Shards", "must be 1 (or 0) for an Escrow limit, got %d: escrow already keeps the row from being held, so shards add nothing", c.Shards)
	}
	if c.Kind == TokenBucket && !c.Start.IsZero() {
		return bad("Start", "applies to FixedWindow only; leave it zero for a TokenBucket")
	}
	c.Period = c.Period.Truncate(time.Microsecond)
	return c, nil
}

// stored is c as a store sees it, for every key.
func (c Config) stored() driver.LimitConfig {
	return driver.LimitConfig{
		Config: algo.Config{
			Kind: algo.Kind(c.Kind), Rate: c.Rate, Period: c.Period.Microseconds(),
			Capacity: c.Capacity, MaxReserved: c.MaxReserved,
		},
		Shards: c.Shards, Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
	}
}
