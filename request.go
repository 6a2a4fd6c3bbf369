package txlimit

import (
	"fmt"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Option modifies one call.
type Option func(*callOptions)

type callOptions struct {
	count   float64
	upTo    bool
	reserve bool
	config  *Config
	holder  *string // Holder's

	idempotency *idempotency // Idempotent's
}

// Count sets the number of tokens a call consumes, checks or credits.
// Defaults to 1. It may be fractional; it must be finite and >= 0.
func Count(n float64) Option { return func(o *callOptions) { o.count = n } }

// UpTo is Count(n) that takes what there is (redis_rate's AllowAtMost): n
// when the limit holds it, otherwise the most whole tokens there are;
// Result.Taken says how many. It denies, taking nothing, only when not even
// one token is there (n itself when n is below one). It never reserves:
// with Reserve, it is an *InvalidError. In LimitAll every limit called with
// UpTo takes the least any of them could take alone (each unit of the work
// needs a token of each), from every limit or from none.
func UpTo(n float64) Option { return func(o *callOptions) { o.count, o.upTo = n, true } }

// Reserve lets Limit take the tokens even when the limit lacks them, as a
// reservation: the result is OK with RetryAfter > 0, meaning the tokens are
// yours and the work should run after RetryAfter without checking the limit
// again. Config.MaxReserved caps the debt. A reservation whose wait would
// reach about 146 years, or whose debt would leave float64's range, is an
// *InvalidError for Count, taking nothing.
func Reserve() Option { return func(o *callOptions) { o.reserve = true } }

// Inline gives the limit's configuration in the call: required for a name
// not given to New, it replaces the configuration of one that was.
func Inline(c Config) Option { return func(o *callOptions) { cc := c; o.config = &cc } }

// request is one call, validated by newRequest.
type request struct {
	name    string
	key     string
	count   float64
	upTo    bool
	reserve bool
	config  Config
	holder  string // a Concurrency limit's holder (Holder, or random)
	// idempotency is the Idempotent option, validated; nil without it.
	idempotency *idempotency
	limit       driver.Limit
	now         *time.Time   // Options.Clock's reading, nil for the store's clock
	obs         *observation // nil unless the Limiter has an Observer
}

// newRequest validates a call. On an error the request still names the
// call, for the Observer.
func (l *Limiter[TTx]) newRequest(name, key string, opts []Option, obs *observation) (request, error) {
	o := callOptions{count: 1}
	for _, opt := range opts {
		opt(&o)
	}
	r := request{name: name, key: key, count: o.count, upTo: o.upTo, reserve: o.reserve, obs: obs}
	if err := validName(name); err != nil {
		return r, err
	}
	if err := validText("key", name, key); err != nil {
		return r, err
	}
	if o.config != nil {
		c, err := o.config.normalized(name)
		if err != nil {
			return r, err
		}
		r.config = c
	} else {
		c, ok := l.limits[name]
		if !ok {
			return r, &InvalidError{Limit: name, Field: "name",
				Problem: "is not a limit given to txlimit.New; add it there or pass txlimit.Inline"}
		}
		r.config = c
	}
	if err := r.checkHolder(o.holder); err != nil {
		return r, err
	}
	if k := o.idempotency; k != nil {
		if r.slot() {
			return r, refuseIdempotent(name, "a Concurrency limit: an acquire with the Holder option is idempotent already (the holder is granted again, taking no second slot)")
		}
		if err := k.check(name); err != nil {
			return r, err
		}
		r.idempotency = k
	}
	if !finite(o.count) || o.count < 0 {
		field := "Count"
		if o.upTo {
			field = "UpTo"
		}
		return r, invalid(name, field, "must be a finite number >= 0, got %v", o.count)
	}
	r.limit = r.config.stored().Limit(name, key)
	var err error
	r.now, err = l.now()
	return r, err
}

// shard is the configuration of one of r's shards.
func (r request) shard() algo.Config { return r.limit.Shard(r.limit.Shards) }

// checkCount rejects a count that no wait would grant.
func (r request) checkCount() error {
	c := r.config
	if r.slot() {
		return r.checkSlot()
	}
	switch {
	case r.upTo && r.reserve:
		return &InvalidError{Limit: r.name, Field: "UpTo", Problem: "cannot be combined with Reserve: a reservation takes its whole count"}
	case r.upTo && r.count >= 1 && c.Capacity < 1:
		return invalid(r.name, "UpTo", "%v asks for whole tokens, but Capacity %v holds less than one; ask for at most Capacity", r.count, c.Capacity)
	case r.upTo:
		return nil // it takes at most Capacity
	case !r.reserve && r.count > c.Capacity:
		return invalid(r.name, "Count", "%v exceeds Capacity %v and could never be granted; raise Capacity or use Reserve", r.count, c.Capacity)
	case r.reserve && c.MaxReserved > 0 && r.count > c.Capacity+c.MaxReserved:
		return invalid(r.name, "Count", "%v exceeds Capacity+MaxReserved %v and could never be reserved; raise MaxReserved", r.count, c.Capacity+c.MaxReserved)
	}
	return nil
}

// take is the store's Take for r.
func (r request) take() driver.TakeParams {
	return driver.TakeParams{
		Limit: r.limit, Count: r.count, UpTo: r.upTo, Reserve: r.reserve, ReadAll: r.config.ReportRemaining,
		Now: r.now, TimeLocks: r.obs != nil,
	}
}

// now reads Options.Clock, or returns nil for the store's clock. A reading
// the store's database cannot hold (driver.ClockRanger) is an *InvalidError.
func (l *Limiter[TTx]) now() (*time.Time, error) {
	if l.clock == nil {
		return nil, nil
	}
	t := l.clock()
	if r, ok := l.store.(driver.ClockRanger); ok {
		if first, last := r.ClockRange(); t.Before(first) || t.After(last) {
			return nil, &InvalidError{Field: "Options.Clock", Problem: fmt.Sprintf(
				"read %v, outside the instants the store's database can hold (%v to %v); keep the test clock within them",
				t, first.Format(time.RFC3339), last.Format(time.RFC3339))}
		}
	}
	t = time.UnixMicro(t.UnixMicro())
	return &t, nil
}

// limitRequest validates a Limit call.
func (l *Limiter[TTx]) limitRequest(name, key string, opts []Option) (request, error) {
	r, err := l.newRequest(name, key, opts, l.observe())
	if err == nil {
		err = r.checkCount()
	}
	return r, err
}

// failedOpen is the Result of r granted by Options.FailOpen.
func (r request) failedOpen(at time.Time) Result {
	return Result{Name: r.name, Key: r.key, Count: r.count, Holder: r.holder, OK: true, FailedOpen: true, At: at}
}
