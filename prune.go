package txlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// defaultPruneBatchSize is PruneOptions.BatchSize's default.
const defaultPruneBatchSize = 1000

// PruneOptions configures Prune. A nil *PruneOptions is the zero value,
// which is ready to use.
type PruneOptions struct {
	// BatchSize is the number of (name, key) pairs one batch, one short
	// transaction, examines. Defaults to 1000.
	BatchSize int
	// MaxBatches bounds the work of one call: Prune stops after this many
	// batches, and the next call on the same Limiter continues where this
	// one stopped. Defaults to 0: go through every key once.
	MaxBatches int
	// Limits gives the configuration of names the Limiter was not given
	// (limits used only with Inline), and replaces the Limiter's own for
	// the names it lists: Prune must judge each limit by the configuration
	// its calls use (a row full under a smaller Capacity is not full under
	// a larger one).
	Limits map[string]Config
}

// PruneResult reports what Prune did.
type PruneResult struct {
	Deleted int // rows deleted
	Keys    int // (name, key) pairs examined
	// Unknown is the number of (name, key) pairs left alone because their
	// name has no configuration, in New or PruneOptions.Limits: often
	// limits no longer used, which ResetTx deletes.
	Unknown int
	Batches int // transactions run
	// Complete reports whether the call reached the last key, and the last
	// expired idempotency key: false when MaxBatches stopped it first.
	Complete bool
}

// Prune deletes the state of limits that have refilled to capacity, which a
// missing row means too: it changes no decision, and keeps the table as
// small as the set of limits that are depleted. It goes through the keys in
// batches of PruneOptions.BatchSize, each in a short transaction of its own
// on the store's pool (without one it returns an *InvalidError). It deletes
// the rows of a (name, key) together, only when it holds all of them and
// every shard, projected to now, is exactly what a missing row would be. On
// PostgreSQL and MySQL it never waits for a row that live traffic holds
// (SKIP LOCKED): a key in use is left to a later run. On SQLite each batch
// takes the write lock, like any writer. Rows whose name has no
// configuration are left alone. Prune stops at the first error (a cancelled
// ctx included) and returns it with what it had done.
//
// When the Limiter (or PruneOptions.Limits) has a Concurrency limit, Prune
// first deletes, in batches of its own, every expired holder of every
// Concurrency limit and the lock rows of keys whose every holder has
// expired (an acquire reclaims its own key's; this is for keys not
// acquired again), passing over rows live traffic holds where the database
// can. Those batches count in Batches, Deleted and MaxBatches.
//
// Once it has reached the last key, Prune deletes the idempotency keys
// (Idempotent) whose window has passed, oldest first, in batches of
// BatchSize of their own (at least one), passing over those a repeat
// holds; they count in Batches, Deleted and MaxBatches too. A call that
// MaxBatches stops before they are done leaves them to the next call,
// which ends the round with them (Complete).
func (l *Limiter[TTx]) Prune(ctx context.Context, opts *PruneOptions) (PruneResult, error) {
	var o PruneOptions
	if opts != nil {
		o = *opts
	}
	if o.BatchSize < 0 {
		return PruneResult{}, &InvalidError{Field: "PruneOptions.BatchSize", Problem: fmt.Sprintf("must be >= 0 (0 means %d), got %d", defaultPruneBatchSize, o.BatchSize)}
	}
	if o.BatchSize == 0 {
		o.BatchSize = defaultPruneBatchSize
	}
	if o.MaxBatches < 0 {
		return PruneResult{}, &InvalidError{Field: "PruneOptions.MaxBatches", Problem: fmt.Sprintf("must be >= 0 (0 means no limit), got %d", o.MaxBatches)}
	}
	limits := make(map[string]driver.LimitConfig, len(l.limits)+len(o.Limits))
	for name, c := range l.limits {
		if c.Kind != Concurrency { // its holders are not rows of the txlimit table
			limits[name] = c.stored()
		}
	}
	for name, c := range o.Limits {
		if err := validName(name); err != nil {
			return PruneResult{}, err
		}
		nc, err := c.normalized(name)
		if err != nil {
			return PruneResult{}, err
		}
		if nc.Kind == Concurrency {
			delete(limits, name)
		} else {
			limits[name] = nc.stored()
		}
	}
	var res PruneResult
	if l.hasSlots(o.Limits) {
		done, err := l.pruneExpired(ctx, o, &res, func(ctx context.Context, max int, now *time.Time) (int, error) {
			return l.store.PruneHolders(ctx, driver.PruneHoldersParams{Max: max, Now: now})
		})
		if err != nil || !done {
			return res, err
		}
	}
	// The idempotency keys come once the last key has been reached, so
	// that calls bounded by MaxBatches go on through the keys; a call that
	// ran out of batches first leaves them to the next (claimsPending),
	// which completes the round with them.
	pruneClaims := func() (PruneResult, error) {
		done, err := l.pruneExpired(ctx, o, &res, func(ctx context.Context, max int, now *time.Time) (int, error) {
			return l.store.PruneClaims(ctx, driver.PruneClaimsParams{Max: max, Now: now})
		})
		l.claimsPending.Store(!done)
		res.Complete = done
		return res, err
	}
	if l.claimsPending.Load() {
		return pruneClaims()
	}

	var after driver.KeyRef
	if p := l.pruneAfter.Load(); p != nil {
		after = *p
	}
	defer func() { l.pruneAfter.Store(&after) }()
	for o.MaxBatches == 0 || res.Batches < o.MaxBatches {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		obs := l.observe()
		now, err := l.now()
		var batch driver.PruneResult
		if err == nil {
			batch, err = l.store.Prune(ctx, driver.PruneParams{After: after, Max: o.BatchSize, Now: now, Limits: limits})
			err = storeErr(err)
		}
		l.report(ctx, obs, opPrune, request{count: float64(batch.Deleted)}, Result{}, err, false)
		if err != nil {
			return res, err
		}
		res.Batches++
		res.Keys += batch.Keys
		res.Unknown += batch.Unknown
		res.Deleted += batch.Deleted
		if batch.Keys < o.BatchSize {
			after = driver.KeyRef{}
			res.Complete = true
			break
		}
		after = batch.Last
	}
	if res.Complete {
		return pruneClaims()
	}
	return res, nil
}
