package txlimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Concurrency limits how many holders run at once per key: at most Capacity
// exports per tenant, calls in flight to a partner's API, sync jobs per
// account. A holder is a row of its own, with an id the caller keeps (the
// Holder option: a job id, a request id, or a random one) and an expiry,
// HoldFor after it was granted:
//
//	limits := map[string]txlimit.Config{
//		"exports": {Kind: txlimit.Concurrency, Capacity: 3, HoldFor: 10 * time.Minute},
//	}
//	res, err := limiter.LimitTx(ctx, tx, "exports", tenant, txlimit.Holder(jobID))
//	…
//	released, err := limiter.ReleaseTx(ctx, tx, "exports", tenant, jobID) // when the export is done
//
// LimitTx (Limit, LimitAllTx, LimitAll) acquires a slot in the caller's
// transaction: granted when fewer than Capacity unexpired holders exist (or
// the id is one of them: its expiry is pushed), denied otherwise, writing
// nothing, with RetryAfter until a slot is expected back (the earliest
// expiry). A rollback leaves no slot held. Remaining is the free slots.
// Release gives the slot back, Extend pushes the expiry of a live holder,
// and an expired holder is reclaimed by the next acquire of its key
// (Options.Observer sees an Event with Op "reclaim"); Prune deletes what is
// left.
//
// The guarantee: at no instant do more than Capacity unexpired holders of a
// key exist, under every isolation level, through connection drops and
// crashes. Acquirers of a key count its holders under one lock, so two
// transactions never both count Capacity-1 and both insert; under
// REPEATABLE READ and SERIALIZABLE a concurrent acquire may fail with a
// serialization error (retryable) rather than count a stale snapshot. The
// price of crash safety is the expiry: a holder still working after its
// expiry has lost its slot, and a second holder may be admitted beside it.
// Extend prevents that: call it every HoldFor/3 while the work runs, and stop
// the work when it returns false. docs/concurrency.md has the patterns.
//
// Capacity is required (a whole number >= 1) and so is HoldFor; Rate,
// Period and the fields of the token kinds do not apply. Commit, CommitTx
// and pgstore.SendBatch refuse a Concurrency limit: a slot guards the work
// that runs after it is acquired. Credit and Wait do not apply either.
const Concurrency Kind = 8

// maxWait is the longest RetryAfter a Result reports, about 146 years
// (2^62 ns in whole µs), and the longest HoldFor.
const maxWait = time.Duration(algo.MaxWait) * time.Microsecond

// maxSlots is the largest Capacity of a Concurrency limit.
const maxSlots = 1_000_000_000

// maxHolderLen bounds the length in bytes of a holder's id, so that
// (name, key, holder) fits one index entry on every store.
const maxHolderLen = 256

// Holder names the holder of a slot of a Concurrency limit: the id the work
// keeps to Release or Extend its slot (a job id, a request id). Without it,
// an acquire makes a random id of 32 hex digits; Result.Holder is the id
// either way. An id that holds a live slot of the key is granted again and
// its expiry pushed, so an acquire retried after an unknown outcome takes
// no second slot. Check takes it too: whether that holder would be granted.
// Non-empty, at most 256 bytes of UTF-8 without NUL; Concurrency limits
// only.
func Holder(id string) Option { return func(o *callOptions) { o.holder = &id } }

// concurrency validates a Concurrency config (normalized's part for the
// kind).
func (c Config) concurrency(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, &InvalidError{Limit: name, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	notHere := func(field, why string) (Config, error) {
		return bad(field, "does not apply to a Concurrency limit, %s: leave it zero", why)
	}
	switch {
	case c.Rate != 0:
		return notHere("Rate", "which counts holders, not tokens (Capacity is the most holders at once)")
	case c.Period != 0:
		return notHere("Period", "whose holders keep their slot until they release it or HoldFor passes")
	case c.MaxReserved != 0:
		return notHere("MaxReserved", "whose slots cannot be reserved")
	case c.Shards > 1 || c.Shards < 0:
		return notHere("Shards", "whose acquirers count the key's holders under one lock")
	case c.ReportRemaining:
		return notHere("ReportRemaining", "which always reports Remaining")
	case !c.Start.IsZero():
		return notHere("Start", "which has no windows")
	case c.Zone != "":
		return notHere("Zone", "which has no windows")
	case c.WeekStart != time.Sunday:
		return notHere("WeekStart", "which has no windows")
	case c.Lease != 0:
		return notHere("Lease", "whose holders are rows of their own, not tokens handed out from memory")
	case c.LeaseFor != 0:
		return notHere("LeaseFor", "which has no leases")
	case c.LeaseAhead != 0:
		return notHere("LeaseAhead", "which has no leases")
	case !finite(c.Capacity) || c.Capacity != math.Trunc(c.Capacity) || c.Capacity < 1 || c.Capacity > maxSlots:
		return bad("Capacity", "is the most holders at once of a Concurrency limit: required, a whole number from 1 to %d, got %v",
			maxSlots, c.Capacity)
	case c.HoldFor < time.Millisecond:
		return bad("HoldFor", "is required for a Concurrency limit: how long a holder keeps its slot without Extend "+
			"(a process that died loses it then); at least 1ms, got %v", c.HoldFor)
	case c.HoldFor > maxWait:
		return bad("HoldFor", "must be at most about 146 years (%v), got %v", maxWait, c.HoldFor)
	}
	c.Shards = 1
	c.HoldFor = c.HoldFor.Truncate(time.Microsecond)
	return c, nil
}

// slot reports whether r is a call on a Concurrency limit.
func (r request) slot() bool { return r.config.Kind == Concurrency }

// checkHolder validates the Holder option of r, id (nil when not given).
func (r *request) checkHolder(id *string) error {
	if id == nil {
		return nil
	}
	if !r.slot() {
		return &InvalidError{Limit: r.name, Field: "Holder", Problem: fmt.Sprintf(
			"applies to Concurrency limits only, and this is a %v limit: leave it out", r.config.Kind.name())}
	}
	if err := validHolder(r.name, *id); err != nil {
		return err
	}
	r.holder = *id
	return nil
}

// validHolder validates a holder's id.
func validHolder(limit, id string) error {
	if id == "" {
		return &InvalidError{Limit: limit, Field: "Holder", Problem: "is empty; pass the id the work keeps " +
			"(a job id, a request id), or leave Holder out for a random one"}
	}
	if len(id) > maxHolderLen {
		return &InvalidError{Limit: limit, Field: "Holder", Problem: fmt.Sprintf(
			"is %d bytes long, more than the %d a holder's id may have; hash it first (for example the hex of its SHA-256)", len(id), maxHolderLen)}
	}
	return validText("Holder", limit, id)
}

// checkSlot rejects the options a slot does not take (checkCount's part for
// Concurrency limits); Count(0) is Check's, and acquiring refuses it.
func (r request) checkSlot() error {
	switch {
	case r.upTo:
		return &InvalidError{Limit: r.name, Field: "UpTo", Problem: "does not apply to a Concurrency limit: a holder takes one slot; leave it out"}
	case r.reserve:
		return &InvalidError{Limit: r.name, Field: "Reserve", Problem: "does not apply to a Concurrency limit, whose slots cannot be " +
			"reserved: when it is full, try again after the Result's RetryAfter"}
	case r.count != 1 && r.count != 0:
		return &InvalidError{Limit: r.name, Field: "Count", Problem: fmt.Sprintf(
			"must be 1 (the default) for a Concurrency limit: a holder takes one slot; got %v", r.count)}
	}
	return nil
}

// acquiring validates r as an acquire of a slot and gives it a random
// holder id when the call named none.
func (r *request) acquiring() error {
	if r.count != 1 {
		return &InvalidError{Limit: r.name, Field: "Count", Problem: fmt.Sprintf(
			"must be 1 (the default) to acquire a slot of a Concurrency limit (Count(0) is for Check); got %v", r.count)}
	}
	if r.holder == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		r.holder = hex.EncodeToString(b)
	}
	return nil
}

// slotParams is the store's acquire of r.
func (r request) slotParams() driver.SlotParams {
	return driver.SlotParams{KeyRef: driver.KeyRef{Name: r.name, Key: r.key}, Holder: r.holder,
		Capacity: int64(r.config.Capacity), HoldFor: r.config.HoldFor}
}

// slotResult is the Result of what a store decided for a slot of r at at.
func (r request) slotResult(s driver.SlotResult, at time.Time) Result {
	res := Result{Name: r.name, Key: r.key, Count: r.count, Holder: r.holder, OK: s.OK, At: at,
		Remaining: max(0, r.config.Capacity-float64(s.Live))}
	if s.OK {
		res.Taken = r.count
	} else {
		res.RetryAfter = min(max(s.Free.Sub(at), 0), maxWait)
	}
	return res
}

// acquire takes a slot of r's Concurrency limit in tx.
func (l *Limiter[TTx]) acquire(ctx context.Context, tx TTx, r request) (Result, error) {
	out, err := l.store.Acquire(ctx, tx, driver.AcquireParams{
		Slots: []driver.SlotParams{r.slotParams()}, Now: r.now, TimeLocks: r.obs != nil})
	if err != nil {
		return Result{}, err
	}
	r.obs.addLockWait(out.LockWait)
	r.obs.reclaimed(r, out.Slots[0].Reclaimed)
	return r.slotResult(out.Slots[0], out.At), nil
}

// acquireAll is LimitAll's call when rs has a Concurrency limit: the slots
// and the takes of rs, all or none, in one Acquire.
func (l *Limiter[TTx]) acquireAll(ctx context.Context, tx TTx, rs []request, obs *observation) (MultiResult, error) {
	p := driver.AcquireParams{Now: rs[0].now, TimeLocks: obs != nil}
	var slots, takes []int
	for i, r := range rs {
		if r.slot() {
			p.Slots, slots = append(p.Slots, r.slotParams()), append(slots, i)
		} else {
			r.now = p.Now
			p.Takes, takes = append(p.Takes, r.take()), append(takes, i)
		}
	}
	all, err := l.store.Acquire(ctx, tx, p)
	if err != nil {
		return MultiResult{}, err
	}
	obs.addLockWait(all.LockWait)
	out := MultiResult{OK: all.OK, Results: make([]Result, len(rs)), At: all.At}
	for j, i := range slots {
		out.Results[i] = rs[i].slotResult(all.Slots[j], all.At)
		obs.reclaimed(rs[i], all.Slots[j].Reclaimed)
	}
	for j, i := range takes {
		if out.Results[i], err = rs[i].result(all.Takes[j]); err != nil {
			return MultiResult{}, err
		}
	}
	for i := range out.Results {
		if !out.OK {
			out.Results[i].Taken = 0 // nothing was taken from any limit
		}
		if out.Results[i].OK == out.OK {
			out.RetryAfter = max(out.RetryAfter, out.Results[i].RetryAfter)
		}
	}
	return out, nil
}

// checkHolders is CheckTx on a Concurrency limit: the key's holders as tx
// sees them, locking nothing.
func (l *Limiter[TTx]) checkHolders(ctx context.Context, tx TTx, r request) (Result, error) {
	read, err := l.store.Holders(ctx, tx, driver.ReadParams{Name: r.name, Key: r.key, Now: r.now})
	if err != nil {
		return Result{}, err
	}
	res := r.slotResult(driver.CheckSlot(r.slotParams(), read.Holders, read.At, r.count), read.At)
	return res, nil
}

// Release is ReleaseTx in a short transaction of its own.
func (l *Limiter[TTx]) Release(ctx context.Context, name, key, holder string) (bool, error) {
	return l.releaseIn(ctx, nil, name, key, holder)
}

// ReleaseTx gives back the slot that holder holds of the Concurrency limit
// name for key, in tx: in the transaction that finishes the work, so that
// the slot is free once the work has committed, or in any later one. It
// returns true when holder held a live slot, and false, having changed
// nothing (but deleted an expired holder's row), when it was released
// already, expired or reclaimed: releasing twice is harmless. It needs no
// config (like Reset), locks no row but the holder's, and never fails
// open.
func (l *Limiter[TTx]) ReleaseTx(ctx context.Context, tx TTx, name, key, holder string) (bool, error) {
	return l.releaseIn(ctx, &tx, name, key, holder)
}

func (l *Limiter[TTx]) releaseIn(ctx context.Context, tx *TTx, name, key, holder string) (bool, error) {
	r, err := l.holderRequest(name, key, holder, false, nil)
	var out driver.HolderResult
	if err == nil {
		out, err = in(ctx, l, tx, false, func(tx TTx) (driver.HolderResult, error) {
			return l.store.Release(ctx, tx, r.holderParams())
		})
	}
	l.report(ctx, r.obs, opRelease, r, r.holderResult(out, err), err, false)
	return out.OK, err
}

// Extend is ExtendTx in a short transaction of its own: the heartbeat of a
// long-running holder.
func (l *Limiter[TTx]) Extend(ctx context.Context, name, key, holder string, opts ...Option) (bool, error) {
	return l.extendIn(ctx, nil, name, key, holder, opts)
}

// ExtendTx pushes the expiry of holder's slot of the Concurrency limit name
// for key to HoldFor from now, when the holder is live, and returns true.
// It returns false, changing nothing, for a holder that is not live
// (expired, reclaimed, released): its slot may be someone else's by now, so
// the work must stop. Call it every HoldFor/3 while the work runs. Only
// Inline applies among opts (for a limit not given to New).
func (l *Limiter[TTx]) ExtendTx(ctx context.Context, tx TTx, name, key, holder string, opts ...Option) (bool, error) {
	return l.extendIn(ctx, &tx, name, key, holder, opts)
}

func (l *Limiter[TTx]) extendIn(ctx context.Context, tx *TTx, name, key, holder string, opts []Option) (bool, error) {
	r, err := l.holderRequest(name, key, holder, true, opts)
	var out driver.HolderResult
	if err == nil {
		out, err = in(ctx, l, tx, false, func(tx TTx) (driver.HolderResult, error) {
			return l.store.Extend(ctx, tx, r.holderParams())
		})
	}
	l.report(ctx, r.obs, opExtend, r, r.holderResult(out, err), err, false)
	return out.OK, err
}

// holderRequest validates a Release or an Extend (opts: Inline only) of
// holder's slot. A Release needs no config, but refuses a name the Limiter
// knows as a limit of another kind.
func (l *Limiter[TTx]) holderRequest(name, key, holder string, extend bool, opts []Option) (request, error) {
	r := request{name: name, key: key, holder: holder, count: 1, obs: l.observe()}
	if err := validName(name); err != nil {
		return r, err
	}
	if err := validText("key", name, key); err != nil {
		return r, err
	}
	if err := validHolder(name, holder); err != nil {
		return r, err
	}
	if _, known := l.limits[name]; known || extend {
		// Extend, or a Release of a name the Limiter has: the config says
		// the kind (and Extend's HoldFor).
		o := callOptions{count: 1}
		for _, opt := range opts {
			opt(&o)
		}
		if o.count != 1 || o.upTo || o.reserve || o.holder != nil || o.idempotency != nil {
			return r, &InvalidError{Limit: name, Field: "opts", Problem: "take Inline only here: the holder is an argument, and a slot has no count"}
		}
		c, ok := l.limits[name]
		if o.config != nil {
			nc, err := o.config.normalized(name)
			if err != nil {
				return r, err
			}
			c, ok = nc, true
		}
		if !ok {
			return r, &InvalidError{Limit: name, Field: "name",
				Problem: "is not a limit given to txlimit.New; add it there or pass txlimit.Inline"}
		}
		if c.Kind != Concurrency {
			return r, &InvalidError{Limit: name, Field: "name", Problem: fmt.Sprintf(
				"is a %v limit; Release and Extend apply to Concurrency limits", c.Kind.name())}
		}
		r.config = c
	}
	var err error
	r.now, err = l.now()
	return r, err
}

// holderParams is the store's Release or Extend of r.
func (r request) holderParams() driver.HolderParams {
	return driver.HolderParams{KeyRef: driver.KeyRef{Name: r.name, Key: r.key}, Holder: r.holder, HoldFor: r.config.HoldFor, Now: r.now}
}

// holderResult is the Result an Event of a Release or an Extend carries.
func (r request) holderResult(out driver.HolderResult, err error) Result {
	if err != nil {
		return Result{}
	}
	return Result{Name: r.name, Key: r.key, Count: 1, Holder: r.holder, OK: out.OK, At: out.At.UTC()}
}

// hasSlots reports whether the Limiter or limits (PruneOptions.Limits) has a
// Concurrency limit, whose holders Prune then deletes once expired.
func (l *Limiter[TTx]) hasSlots(limits map[string]Config) bool {
	for _, m := range []map[string]Config{l.limits, limits} {
		for _, c := range m {
			if c.Kind == Concurrency {
				return true
			}
		}
	}
	return false
}

// pruneExpired is a pass of Prune over rows that expire: the holders of
// Concurrency limits and the lock rows of keys whose every holder has
// expired (store.PruneHolders), or the idempotency keys whose window has
// passed (store.PruneClaims). It deletes them with batch, in batches of
// o.BatchSize, each a transaction of its own, until a batch finds fewer or
// o.MaxBatches is reached (done false).
func (l *Limiter[TTx]) pruneExpired(ctx context.Context, o PruneOptions, res *PruneResult,
	batch func(ctx context.Context, max int, now *time.Time) (int, error)) (done bool, err error) {
	for o.MaxBatches == 0 || res.Batches < o.MaxBatches {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		obs := l.observe()
		now, err := l.now()
		var n int
		if err == nil {
			n, err = batch(ctx, o.BatchSize, now)
			err = storeErr(err)
		}
		l.report(ctx, obs, opPrune, request{count: float64(n)}, Result{}, err, false)
		if err != nil {
			return false, err
		}
		res.Batches++
		res.Deleted += n
		if n < o.BatchSize {
			return true, nil
		}
	}
	return false, nil
}
