package txlimit

import (
	"context"
	"errors"
	"time"
)

// Observer is told about every decision a Limiter makes and every error it
// returns: set Options.Observer to export metrics or logs. It is called on
// the caller's goroutine after the call has decided (for the …Tx forms,
// before the caller's transaction ends), so it must be fast and safe for
// concurrent use, and must not use the transaction. A Limiter without an
// Observer does no extra work at all: no clock reads, no Event.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Op names the operation an Event reports.
type Op uint8

const (
	// OpLimit is Limit or LimitTx.
	OpLimit Op = iota + 1
	// OpCheck is Check or CheckTx.
	OpCheck
	// OpLimitAll is LimitAll or LimitAllTx: one Event per limit of the
	// call, or one Event with Err when the call failed. When the call was
	// denied, every limit's Event is a denial (nothing was taken from any
	// of them), with RetryAfter 0 for a limit whose own tokens were there.
	OpLimitAll
)

func (o Op) String() string {
	switch o {
	case OpLimit:
		return "limit"
	case OpCheck:
		return "check"
	case OpLimitAll:
		return "limit_all"
	}
	return "op?"
}

// Event is one call as an Observer sees it.
type Event struct {
	Op    Op
	Name  string
	Key   string
	Count float64
	// Result is the decision. It is the zero Result when Err is set, unless
	// FailedOpen.
	Result Result
	// Err is the error of a failed call, also when Options.FailOpen turned
	// it into a grant (FailedOpen).
	Err error
	// FailedOpen reports that the store failed and Options.FailOpen granted
	// the call without consuming anything.
	FailedOpen bool
	// Duration is how long the call took, as its caller waited for it.
	Duration time.Duration
	// LockWait is the part of Duration spent in the statements that lock
	// the limit's rows: the wait for other transactions that hold them
	// plus those statements' round trips. A LockWait close to Duration on a
	// busy limit is the sign that it needs Shards.
	LockWait time.Duration
}

// Outcome classifies the event for a metric label: "allowed", "reserved",
// "denied", "failed_open" or "error".
func (e Event) Outcome() string {
	switch {
	case e.FailedOpen:
		return "failed_open"
	case e.Err != nil:
		return "error"
	case e.Result.Reserved():
		return "reserved"
	case e.Result.OK:
		return "allowed"
	}
	return "denied"
}

// observation times one call for the Observer; it is nil, and every method
// a no-op, when the Limiter has none.
type observation struct {
	start    time.Time
	lockWait time.Duration
}

func (l *Limiter[TTx]) observe() *observation {
	if l.observer == nil {
		return nil
	}
	return &observation{start: time.Now()}
}

// lockStart and lockEnd bracket a statement that takes row locks.
func (o *observation) lockStart() time.Time {
	if o == nil {
		return time.Time{}
	}
	return time.Now()
}

func (o *observation) lockEnd(start time.Time) {
	if o != nil {
		o.lockWait += time.Since(start)
	}
}

func (l *Limiter[TTx]) report(ctx context.Context, o *observation, op Op, r request, res Result, err error, failedOpen bool) {
	if o == nil {
		return
	}
	l.observer.Observe(ctx, Event{
		Op: op, Name: r.name, Key: r.key, Count: r.count, Result: res, Err: err, FailedOpen: failedOpen,
		Duration: time.Since(o.start), LockWait: o.lockWait,
	})
}

// failOpen decides whether an error of a form without Tx is turned into a
// grant under Options.FailOpen. Bad input and a missing pool are the
// program's mistakes, and a cancelled context means the caller has gone:
// those stay errors.
func (l *Limiter[TTx]) failOpen(err error) bool {
	return l.failOpenOnError && err != nil && !errors.Is(err, ErrInvalid) &&
		!errors.Is(err, ErrNoPool) && !errors.Is(err, context.Canceled)
}
