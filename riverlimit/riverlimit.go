// Package riverlimit limits River jobs with txlimit: at most N jobs running
// at once per key (a tenant, an account, a partner), and rate limits per key,
// as a River worker middleware.
//
//	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
//		// At most 3 exports running per tenant; a dead worker's slot comes back after 1 minute.
//		"exports": {Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Minute},
//	}, nil)
//	…
//	mw, err := riverlimit.New(limiter, riverlimit.Config{Rules: []riverlimit.Rule{{
//		Kinds:  []string{ExportArgs{}.Kind()},
//		Limits: []string{"exports"},
//		Key:    riverlimit.ArgsKey(func(a ExportArgs) string { return a.Tenant }),
//	}}})
//	…
//	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		Middleware: []rivertype.Middleware{mw},
//		…
//	})
//
// # What a job goes through
//
// Before a job of a kind the rules name runs, the middleware takes every
// limit its rules give it, for the key each rule's Key derives from the job,
// in one txlimit LimitAll (a short transaction of its own), all or none:
//
//   - A Concurrency limit's slot is held while the job runs, by the holder
//     Holder(job) ("river-job-" and the job's id), and released when the work
//     ends, whatever its outcome: it returned, failed, panicked, was
//     cancelled or timed out. The id is the job's, so a job that runs again
//     while its earlier attempt's slot is still live (River's rescuer re-ran
//     the job of a worker that died) is granted that slot again and holds no
//     second one.
//   - A rate limit's token is taken for each run: a retried job takes
//     another.
//
// When a limit denies, nothing is taken, the job does not run, and the
// middleware snoozes it (river.JobSnooze), which costs it no attempt: until
// the denial's RetryAfter, at most Config.SlotWait when only slots were
// missing, plus a random jitter below Config.Spread (package jitter), so
// that jobs denied together do not come back together. A job of a kind no
// rule names runs untouched, without a database call.
//
// An error of the acquire (the database failed) or of a Key is the attempt's
// error: River retries the job by its retry policy (wrap a Key's error with
// river.JobCancel to discard the job instead). txlimit.Options.FailOpen lets
// jobs run without their limits when the database fails.
//
// # HoldFor, job timeouts and heartbeats
//
// HoldFor (the Concurrency limit's config) is how long the slot of a worker
// that died mid-job (killed, out of memory, its machine gone) stays taken:
// nobody releases it, and it comes back at its expiry, HoldFor after the
// last grant or extension, and not before. While a job runs, the middleware
// extends its slots every HoldFor/3 (txlimit's Extend, the heartbeat), so
// HoldFor does not bound how long a job may run: a job that outlives its
// River timeout (JobTimeout, or the worker's Timeout; a job that ignores its
// cancelled context runs on) keeps its slot as long as it runs. Choose
// HoldFor:
//
//   - as short as you can bear a dead worker's slot to stay taken, and
//   - well above the time between two heartbeats, a stalled garbage
//     collector or a slow database included: 30 s or more.
//
// A HoldFor above the job timeout (River's default JobTimeout is 1 minute)
// means a job that respects its timeout never extends at all: the heartbeat
// costs nothing. A shorter one costs one short transaction per held slot
// every HoldFor/3 of a job's run. Either way a dead worker's slot comes back
// long before River's rescuer retries its job (RescueStuckJobsAfter, an hour
// by default).
//
// When a heartbeat finds the slot lost (Extend returns false: it expired
// during a stall and may be someone else's now, or an operator released it),
// or cannot extend it before its expiry, the middleware cancels the job's
// context with the cause ErrSlotLost (context.Cause): stop the work and
// return, and River retries the job.
//
// # Releasing in the transaction that completes the job
//
// A worker that completes its job in its own transaction
// (river.JobCompleteTx) can release its slots in that transaction too, with
// ReleaseTx: the slot is given back exactly when the job's work and its
// completion commit, and not while they might still roll back. The
// middleware still releases after the work (a no-op then), so a transaction
// that rolled back leaves no slot behind.
//
// # Observing
//
// Every acquire, denial, release and extension is a txlimit Event
// (txlimit.Options.Observer), with the job's holder id; a release that
// failed (the slot then comes back at its expiry) is seen there, since it
// changes nothing of the job's outcome. River's own events say which jobs
// were snoozed (river.EventKindJobSnoozed).
package riverlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/jitter"
)

// Rule applies limits to the jobs of some kinds.
type Rule struct {
	// Kinds are the job kinds the rule applies to (JobArgs.Kind()).
	// Required.
	Kinds []string
	// Limits name limits of the Limiter: a Concurrency limit's slot is held
	// while the job runs, a rate limit's token is taken by each run.
	// Required; a limit may appear once per kind, across the rules.
	Limits []string
	// Key returns the key of the job for the rule's limits: the tenant of
	// its arguments (ArgsKey), its queue, a constant for a global limit. An
	// error fails the attempt, and River retries the job.
	Key func(job *rivertype.JobRow) (string, error)
}

// Config configures the middleware.
type Config struct {
	// Rules say which jobs take which limits, by what key. A job of a kind
	// that two rules name takes the limits of both, all or none.
	Rules []Rule
	// SlotWait is the longest a job denied only for want of a slot is
	// snoozed (before jitter). A running job gives its slot back when it
	// ends, which the denial's RetryAfter (the earliest expiry of a
	// holder) does not foresee: without the cap a job would wait for the
	// expiry although the slot is likely free much sooner. A denial by a
	// rate limit snoozes the job for its RetryAfter, which is exact. 0
	// means 5 s; at least 1 ms.
	SlotWait time.Duration
	// Spread is the jitter: a denied job is snoozed for a random duration
	// in [d, d+Spread), d being its wait, so that jobs denied together do
	// not come back together. 0 means 1 s; a negative Spread adds none.
	Spread time.Duration
}

// ErrSlotLost is the cause (context.Cause) of the cancellation of a job whose
// slot was lost while it ran: a heartbeat found it expired or released, or
// could not extend it before its expiry. Another job may hold it by then:
// stop the work.
var ErrSlotLost = errors.New("riverlimit: the job's concurrency slot was lost (expired or released): stop the work")

// Middleware is the River worker middleware that applies the limits; add it
// to river.Config's Middleware.
type Middleware[TTx any] struct {
	river.MiddlewareDefaults
	limiter  *txlimit.Limiter[TTx]
	byKind   map[string][]limit
	slotWait time.Duration
	spread   time.Duration
}

var _ rivertype.WorkerMiddleware = (*Middleware[any])(nil)

// limit is one limit a job kind takes.
type limit struct {
	name    string
	rule    int // the index of its rule, whose Key gives its key
	key     func(*rivertype.JobRow) (string, error)
	slot    bool          // a Concurrency limit
	holdFor time.Duration // its HoldFor
}

// New returns the middleware that applies cfg's rules with limiter, whose
// store must have a pool (txlimit's forms without Tx: pgstore.New(pool),
// for example): the middleware takes, extends and releases in short
// transactions of its own. A bad cfg is an *txlimit.InvalidError naming the
// field.
func New[TTx any](limiter *txlimit.Limiter[TTx], cfg Config) (*Middleware[TTx], error) {
	bad := func(limitName, field, problem string, args ...any) (*Middleware[TTx], error) {
		return nil, &txlimit.InvalidError{Limit: limitName, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	if limiter == nil {
		return bad("", "limiter", "is nil; pass the *txlimit.Limiter whose limits the rules name")
	}
	if len(cfg.Rules) == 0 {
		return bad("", "Config.Rules", "is empty; give at least one Rule (the job kinds, the limits and the key)")
	}
	switch {
	case cfg.SlotWait == 0:
		cfg.SlotWait = 5 * time.Second
	case cfg.SlotWait < time.Millisecond:
		return bad("", "Config.SlotWait", "must be at least 1ms (or 0 for 5s), got %v", cfg.SlotWait)
	}
	switch {
	case cfg.Spread == 0:
		cfg.Spread = time.Second
	case cfg.Spread < 0:
		cfg.Spread = 0
	}
	m := &Middleware[TTx]{limiter: limiter, byKind: map[string][]limit{}, slotWait: cfg.SlotWait, spread: cfg.Spread}
	for i, r := range cfg.Rules {
		field := func(f string) string { return fmt.Sprintf("Config.Rules[%d].%s", i, f) }
		if len(r.Kinds) == 0 {
			return bad("", field("Kinds"), "is empty; name the job kinds (JobArgs.Kind()) the rule applies to")
		}
		if len(r.Limits) == 0 {
			return bad("", field("Limits"), "is empty; name the limits of the Limiter the jobs take")
		}
		if r.Key == nil {
			return bad("", field("Key"), "is nil; give the function that derives the limits' key from a job (ArgsKey, for example)")
		}
		var ls []limit
		for _, name := range r.Limits {
			c, ok := limiter.Config(name)
			if !ok {
				return bad(name, field("Limits"), "names a limit the Limiter does not have; give it to txlimit.New")
			}
			ls = append(ls, limit{name: name, rule: i, key: r.Key, slot: c.Kind == txlimit.Concurrency, holdFor: c.HoldFor})
		}
		for _, kind := range r.Kinds {
			if kind == "" {
				return bad("", field("Kinds"), "has an empty kind; name job kinds as their JobArgs.Kind() returns them")
			}
			for _, l := range ls {
				for _, had := range m.byKind[kind] {
					if had.name == l.name {
						return bad(l.name, field("Limits"), "applies to kind %q a second time (another rule, or twice in this one); "+
							"a job takes each limit once: give the kind one rule for it", kind)
					}
				}
				m.byKind[kind] = append(m.byKind[kind], l)
			}
		}
	}
	return m, nil
}

// Holder returns the holder id of job's slots, "river-job-" and the job's id:
// the same for every attempt of the job. An operator releases a slot of a
// job known to be gone with `txlimit release NAME KEY river-job-ID`.
func Holder(job *rivertype.JobRow) string { return "river-job-" + strconv.FormatInt(job.ID, 10) }

// ArgsKey returns a Rule.Key that decodes a job's arguments (JSON) into an
// A and returns key(args): ArgsKey(func(a ExportArgs) string { return
// a.Tenant }).
func ArgsKey[A any](key func(args A) string) func(job *rivertype.JobRow) (string, error) {
	return func(job *rivertype.JobRow) (string, error) {
		var args A
		if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
			return "", fmt.Errorf("riverlimit: the arguments of job %d (kind %q): %w", job.ID, job.Kind, err)
		}
		return key(args), nil
	}
}

// slot is a slot a job holds.
type slot struct {
	name, key string
	holdFor   time.Duration
}

// held is what the middleware holds for a job, in the job's context for
// ReleaseTx.
type held[TTx any] struct {
	limiter  *txlimit.Limiter[TTx]
	holder   string
	slots    []slot
	released atomic.Bool // ReleaseTx was called
}

type heldKey struct{}

// Work implements rivertype.WorkerMiddleware: it takes the job's limits,
// snoozes the job when they deny, and otherwise runs it (doInner), extends
// its slots while it runs and releases them when it ends.
func (m *Middleware[TTx]) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	ls := m.byKind[job.Kind]
	if len(ls) == 0 {
		return doInner(ctx)
	}
	h := &held[TTx]{limiter: m.limiter, holder: Holder(job)}
	reqs := make([]txlimit.Request, len(ls))
	keys := map[int]string{} // by rule: each rule's Key runs once
	for i, l := range ls {
		key, ok := keys[l.rule]
		if !ok {
			var err error
			if key, err = l.key(job); err != nil {
				return err
			}
			keys[l.rule] = key
		}
		reqs[i] = txlimit.Request{Name: l.name, Key: key}
		if l.slot {
			reqs[i].Options = []txlimit.Option{txlimit.Holder(h.holder)}
		}
	}
	res, err := m.limiter.LimitAll(ctx, reqs...)
	if err != nil {
		return fmt.Errorf("riverlimit: job %d (kind %q): %w", job.ID, job.Kind, err)
	}
	if !res.OK {
		return river.JobSnooze(m.snooze(ls, res))
	}
	for i, l := range ls {
		// A slot granted because the store failed (Options.FailOpen) was
		// not written: there is nothing to extend or release.
		if l.slot && !res.Results[i].FailedOpen {
			h.slots = append(h.slots, slot{name: l.name, key: reqs[i].Key, holdFor: l.holdFor})
		}
	}
	if len(h.slots) == 0 {
		return doInner(ctx)
	}
	// The release runs on a panic too: the panic goes on up to River's
	// executor, which records it as the attempt's outcome.
	defer h.release(ctx)
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, heldKey{}, h))
	defer cancel(nil)
	stopped := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(stopped)
		h.heartbeat(ctx, done, cancel)
	}()
	defer func() {
		close(done)
		<-stopped
	}()
	return doInner(ctx)
}

// snooze is how long a job denied by res waits: the RetryAfter, at most
// SlotWait when only slots denied, plus jitter.
func (m *Middleware[TTx]) snooze(ls []limit, res txlimit.MultiResult) time.Duration {
	d := res.RetryAfter
	onlySlots := true
	for i, r := range res.Results {
		if !r.OK && !ls[i].slot {
			onlySlots = false
		}
	}
	if onlySlots {
		d = min(d, m.slotWait)
	}
	return jitter.Spread(d, m.spread)
}

// releaseTimeout bounds the release after the work, whose context may be
// cancelled already: a release that fails leaves the slot to its expiry.
const releaseTimeout = 10 * time.Second

// release gives back every slot of h, on a context that the job's end does
// not cancel. Its errors are seen by the limiter's Observer.
func (h *held[TTx]) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	for _, s := range h.slots {
		_, _ = h.limiter.Release(ctx, s.name, s.key, h.holder)
	}
}

// heartbeat extends h's slots every HoldFor/3 (the shortest one's) until
// done closes, and cancels the job with ErrSlotLost when a slot is lost or
// could not be extended before its expiry. A slot found gone after
// ReleaseTx was released by the job itself.
func (h *held[TTx]) heartbeat(ctx context.Context, done <-chan struct{}, cancel context.CancelCauseFunc) {
	every := h.slots[0].holdFor
	for _, s := range h.slots[1:] {
		every = min(every, s.holdFor)
	}
	every /= 3
	t := time.NewTicker(every)
	defer t.Stop()
	extended := make([]time.Time, len(h.slots)) // the last extension known to have committed
	for i := range extended {
		extended[i] = time.Now() // the grant, a little earlier
	}
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i, s := range h.slots {
			ok, err := h.limiter.Extend(ctx, s.name, s.key, h.holder)
			switch {
			case err == nil && ok:
				extended[i] = time.Now()
			case h.released.Load():
				return // ReleaseTx gave the slots back: the job is finishing
			case err == nil:
				cancel(ErrSlotLost)
				return
			case time.Since(extended[i]) >= s.holdFor-every/2:
				// Not extended, and the slot expires before the next beat.
				cancel(fmt.Errorf("%w: %s for %q not extended (%w)", ErrSlotLost, s.name, s.key, err))
				return
			}
		}
	}
}

// ReleaseTx gives back, in tx, the slots the middleware holds for the job
// whose context ctx is (the ctx of the worker's Work): in the transaction
// that completes the job (river.JobCompleteTx), so that the slots are free
// once the job's work and completion have committed, and not before.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// … the job's work …
//		if _, err := riverlimit.ReleaseTx(ctx, tx); err != nil {
//			return err
//		}
//		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
//		return err
//	})
//
// It returns true when the job held slots and every one was live. The
// middleware still releases after the work, which changes nothing when tx
// committed and gives the slots back when it rolled back. Outside a job the
// middleware holds slots for, it does nothing and returns false; on a tx
// type other than the Limiter's, it returns an error.
func ReleaseTx[TTx any](ctx context.Context, tx TTx) (bool, error) {
	v := ctx.Value(heldKey{})
	if v == nil {
		return false, nil
	}
	h, ok := v.(*held[TTx])
	if !ok {
		return false, fmt.Errorf("riverlimit.ReleaseTx: tx is a %T, and the job's slots are held by a limiter of another transaction type", tx)
	}
	h.released.Store(true)
	all := true
	for _, s := range h.slots {
		ok, err := h.limiter.ReleaseTx(ctx, tx, s.name, s.key, h.holder)
		if err != nil {
			return false, err
		}
		all = all && ok
	}
	return all, nil
}
