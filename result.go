package txlimit

import (
	"math"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Result is the outcome of Limit or Check, or of one limit of LimitAll.
type Result struct {
	Name string
	Key  string
	// Count is the number of tokens the call asked for: what a cancelled
	// reservation gives back with Credit.
	Count float64
	// Taken is the number of tokens the call took: Count for a grant (a
	// reservation included), what UpTo found, 0 for a denial. For Check,
	// what LimitTx would take now.
	Taken float64
	// OK reports whether the tokens were granted (for Check, would be).
	OK bool
	// FailedOpen reports that the store failed and Options.FailOpen
	// granted the call without consuming anything.
	FailedOpen bool
	// RetryAfter is, when OK is false, the time until the same request
	// would be granted. When OK is true and RetryAfter > 0, the tokens were
	// reserved: run the work after RetryAfter, without checking again.
	// It is never negative and never more than about 146 years (2^62 ns):
	// a denial whose wait is longer says that. For a Concurrency limit,
	// the time until a slot is expected back (the earliest expiry of a live
	// holder); a Release frees one sooner.
	RetryAfter time.Duration
	At         time.Time // the clock reading the decision was made at
	// Remaining is the number of tokens the limit holds after the call,
	// summed over all shards and projected to At; negative while
	// reservations are outstanding. It is read under the call's locks,
	// except where the call locked nothing or not every shard (a denial
	// decided on committed state, one free shard read with
	// Config.ReportRemaining): there the other shards count as last
	// committed. It is 0 when Partial is set. For a Concurrency limit, the
	// free slots after the call: Capacity less the live holders.
	Remaining float64
	// NextToken is the time from At until the limit holds one whole token
	// more than floor(Remaining) (at least one), if no call takes or gives
	// back tokens meanwhile: the HTTP RateLimit header's effective window.
	// It is 0 when the limit will never hold that many (its Capacity is
	// lower), and when Partial is set; never more than RetryAfter's bound.
	NextToken time.Duration
	// Partial reports that Remaining and NextToken are unknown (and 0): the
	// call read one free shard of a sharded limit, on PostgreSQL, without
	// Config.ReportRemaining.
	Partial bool
	// Leased is, for Check, the tokens of the key this Limiter holds in
	// leases (Config.Lease) and has not handed out: taken from Remaining
	// already, not yet spent. 0 for the other calls.
	Leased float64
	// Holder is, for a Concurrency limit, the holder's id: the Holder
	// option's, or the random one an acquire made without it (also on a
	// denial). Release and Extend take it.
	Holder string
	// Repeat reports that the call repeated an idempotency key within its
	// window (Idempotent): it took nothing, and the rest of the Result is
	// the first call's.
	Repeat bool `json:"-"`
	// Paused reports a denial because the key is paused (Limiter.Pause):
	// RetryAfter is the time until the pause ends, whatever the tokens.
	Paused bool
}

// Err returns nil when the result is OK (a reservation included) and a
// *RateLimitedError otherwise, for code that prefers the error style.
func (r Result) Err() error {
	if r.OK {
		return nil
	}
	return &RateLimitedError{Name: r.Name, Key: r.Key, RetryAfter: r.RetryAfter, Paused: r.Paused}
}

// result is the Result of what a store decided for r.
func (r request) result(t driver.TakeResult) (Result, error) {
	d := t.Decision
	if d.Overflow {
		return Result{}, invalid(r.name, "Count", "%v reserved at Rate %v per %v would put the limit in a debt it repays "+
			"only after about 146 years or more, or beyond what a float64 holds; nothing was taken. Lower Count, raise Rate, "+
			"or set MaxReserved to cap the debt", r.count, r.config.Rate, r.config.Period)
	}
	res := Result{
		Name: r.name, Key: r.key, Count: r.count, OK: d.OK, Taken: t.Taken,
		RetryAfter: time.Duration(d.RetryAfter) * time.Microsecond,
		At:         t.At,
		Partial:    t.States == nil,
		Paused:     t.Paused,
	}
	if !r.upTo && d.OK {
		res.Taken = r.count
	}
	if t.States != nil {
		now := t.At.UnixMicro()
		res.Remaining = algo.Pooled(r.shard(), t.States, now)
		// The time until a request of target tokens would fit is exactly
		// the time until the limit holds them.
		if target := math.Floor(max(res.Remaining, 0)) + 1; target <= r.config.Capacity {
			_, next := algo.TakeShards(r.shard(), t.States, now, target, false)
			res.NextToken = time.Duration(next.RetryAfter) * time.Microsecond
		}
	}
	return res, nil
}
