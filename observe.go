package txlimit

import (
	"context"
	"errors"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// The operations an Event reports.
const (
	opLimit    = "limit"
	opCheck    = "check"
	opLimitAll = "limit_all"
	opCommit   = "commit"
	opBatch    = "batch"
	opCredit   = "credit"
	opReset    = "reset"
	opPause    = "pause"
	opPrune    = "prune"
	opRelease  = "release"
	opExtend   = "extend"
	opReclaim  = "reclaim"
	// opLeaseAhead is a lease taken ahead in the background that failed.
	opLeaseAhead = "lease_ahead"
)

// Event is one call as Options.Observer sees it, with its decision or its
// error and the time spent waiting for row locks.
type Event struct {
	// Op names the operation, with its …Tx form: "limit", "check",
	// "credit" (Count is the count credited), "reset", "pause"; "limit_all", one
	// Event per limit, or one with Err when the call failed (when the call
	// was denied, every limit's Event is a denial, with RetryAfter 0 for a
	// limit whose own tokens were there); "commit" (CommitTx, Commit) and
	// "batch" (pgstore.SendBatch), as "limit_all", a denial being a call
	// whose work did not take effect, and Err set when it failed for
	// another reason (fn's error, the batch's statements' included);
	// "prune", one batch (Count is the rows it deleted; Name and Key are
	// empty); "lease_ahead", a lease taken ahead that failed (Err is its
	// error, Count the tokens it asked for; no caller saw the error). A
	// Concurrency limit's acquire is a "limit" or "limit_all" Event with
	// Holder set; "release" and "extend" (Release, Extend: Result.OK is
	// what they returned); "reclaim", one Event per expired holder an
	// acquire deleted (Holder is its id, Count 1), told after the
	// acquire's own (for the …Tx forms, undone if the caller's transaction
	// rolls back).
	Op    string
	Name  string
	Key   string
	Count float64
	// Holder is the holder's id in the Events of a Concurrency limit.
	Holder string
	// Result is the decision: the zero Result when Err is set, unless
	// FailedOpen. A repeat of an idempotency key (Idempotent) reports the
	// first call's Result with Repeat set: it took nothing.
	Result Result
	// Err is the error of a failed call, also when FailedOpen.
	Err        error
	FailedOpen bool          // as Result.FailedOpen
	Duration   time.Duration // how long the call took, as its caller waited
	// LockWait is the part of Duration spent in the statements that lock
	// the limit's rows. A LockWait close to Duration on a busy limit says
	// it needs Shards.
	LockWait time.Duration
	// Outcome classifies the event for a metric label: "allowed",
	// "reserved", "denied", "failed_open" or "error".
	Outcome string
	// ErrorKind classifies Err for a metric label, in few values: "" when
	// Err is nil; "invalid" (*InvalidError); "not_migrated"
	// (ErrNotMigrated); "canceled" and "deadline_exceeded" for the context;
	// "database" for every other error of the store.
	ErrorKind string
}

// outcome is e's Outcome.
func (e Event) outcome() string {
	switch {
	case e.FailedOpen:
		return "failed_open"
	case e.Err != nil:
		return "error"
	case e.Result.OK && e.Result.RetryAfter > 0:
		return "reserved"
	case e.Result.OK:
		return "allowed"
	}
	return "denied"
}

// errorKind is e's ErrorKind.
func (e Event) errorKind() string {
	switch err := e.Err; {
	case err == nil:
		return ""
	case errors.As(err, new(*InvalidError)):
		return "invalid"
	case errors.Is(err, ErrNotMigrated):
		return "not_migrated"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "database"
}

// observation times one call for the Observer; it is nil, and every method
// a no-op, when the Limiter has none.
type observation struct {
	start    time.Time
	lockWait time.Duration
	// reclaims are the Events of the expired holders the call reclaimed,
	// told after the call's own.
	reclaims []Event
}

func (l *Limiter[TTx]) observe() *observation {
	if l.observer == nil {
		return nil
	}
	return &observation{start: time.Now()}
}

// addLockWait adds the lock wait a store measured.
func (o *observation) addLockWait(d time.Duration) {
	if o != nil {
		o.lockWait += d
	}
}

func (l *Limiter[TTx]) report(ctx context.Context, o *observation, op string, r request, res Result, err error, failedOpen bool) {
	if o == nil {
		return
	}
	e := Event{
		Op: op, Name: r.name, Key: r.key, Count: r.count, Holder: r.holder, Result: res, Err: err, FailedOpen: failedOpen,
		Duration: time.Since(o.start), LockWait: o.lockWait,
	}
	e.Outcome, e.ErrorKind = e.outcome(), e.errorKind()
	l.observer(ctx, e)
	if err == nil {
		for _, rec := range o.reclaims {
			l.observer(ctx, rec)
		}
	}
	o.reclaims = nil
}

// reclaimed records the reclaim of holders, expired holders of r's key that
// r's acquire deleted, for the Observer.
func (o *observation) reclaimed(r request, holders []string) {
	if o == nil {
		return
	}
	for _, h := range holders {
		res := Result{Name: r.name, Key: r.key, Count: 1, Taken: 1, Holder: h, OK: true}
		o.reclaims = append(o.reclaims, Event{Op: opReclaim, Name: r.name, Key: r.key, Count: 1, Holder: h,
			Result: res, Outcome: "allowed"})
	}
}

// failOpen decides whether an error of a form without Tx is turned into a
// grant under Options.FailOpen. The program's or the deployment's mistakes,
// and a cancelled context (the caller has gone), stay errors.
func (l *Limiter[TTx]) failOpen(err error) bool {
	return l.failOpenOnError && err != nil && !errors.As(err, new(*InvalidError)) &&
		!errors.Is(err, ErrNotMigrated) && !errors.Is(err, driver.ErrSetup) && !errors.Is(err, context.Canceled)
}
