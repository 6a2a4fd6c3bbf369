package txlimit

import (
	"context"
	"errors"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// CommitTx takes the limits of reqs, all or none as LimitAllTx takes them,
// and ends tx with the decision: it commits tx when every limit grants and
// rolls it back otherwise, so that the tokens are spent if and only if tx's
// work commits with them. Call it in place of tx.Commit when the decision
// can wait until the work is done; LimitTx decides before the work.
//
// The error is nil if and only if tx committed. A denial returns the
// MultiResult (each Result is what Check would say) and its Err, a
// *RateLimitedError. An error matching ErrCommitUnknown means the
// connection failed during the COMMIT: tx may or may not have committed.
// Bad input, Reserve and UpTo (which decide what the work is to be)
// included, is an *InvalidError returned before anything is sent, tx left
// open for the caller's deferred Rollback, as is a savepoint passed for tx
// (pgstore refuses one: its COMMIT would commit the outer transaction);
// after any other error tx has been rolled back. CommitTx never fails open.
//
// On pgstore, when every limit is an unsharded token bucket or fixed
// window, the takes go with the COMMIT in one pipeline, so the rows are
// locked only while the commit runs (pgx then needs a round trip to close
// tx, which Commit saves); other limits, and every limit on the
// database/sql stores, are taken as LimitAllTx takes them. A limit with
// Config.Lease is taken from its row. docs/commit.md compares the modes.
func (l *Limiter[TTx]) CommitTx(ctx context.Context, tx TTx, reqs ...Request) (MultiResult, error) {
	return l.commitIn(ctx, &tx, nil, reqs)
}

// Commit is CommitTx in a transaction of its own, as pgx.BeginFunc runs
// one: it begins a transaction on the store's pool, runs fn in it and ends
// it as CommitTx does (on pgstore with no round trip of the limiter's own).
// An error of fn rolls the transaction back, takes nothing and is returned
// as it is; fn must not commit or roll back tx itself. The requests are
// validated before the transaction begins, and a limit with Config.Lease is
// taken from its lease then: Commit is the form that honours leases
// (docs/hot-keys.md). A store without a pool is an *InvalidError.
func (l *Limiter[TTx]) Commit(ctx context.Context, fn func(tx TTx) error, reqs ...Request) (MultiResult, error) {
	return l.commitIn(ctx, nil, fn, reqs)
}

func (l *Limiter[TTx]) commitIn(ctx context.Context, tx *TTx, fn func(TTx) error, reqs []Request) (MultiResult, error) {
	return l.takeWith(ctx, opCommit, atCommit, reqs, tx == nil, func(p driver.TakeAllParams) (driver.TakeAllResult, error) {
		if tx != nil {
			return l.store.Commit(ctx, *tx, p)
		}
		res, err := l.store.InTxCommit(ctx, fn, p)
		return res, storeErr(err)
	})
}

// takeWith is a call whose work is fixed before the limits are taken (when):
// send has the store take them and run the work, after the leased limits
// are taken from their leases (with leases). A denial is the error.
func (l *Limiter[TTx]) takeWith(ctx context.Context, op, when string, reqs []Request, leases bool,
	send func(driver.TakeAllParams) (driver.TakeAllResult, error)) (MultiResult, error) {
	obs := l.observe()
	rs, err := l.newRequests(reqs)
	for _, r := range rs {
		if err == nil {
			err = r.checkFixedWork(when)
		}
	}
	var res MultiResult
	if err == nil {
		res, err = l.commit(ctx, leases, rs, obs, send)
	}
	res, err = l.finishAll(ctx, op, obs, rs, res, err, false)
	if err == nil {
		err = res.Err() // a denial: the work did not take effect
	}
	return res, err
}

// commit takes the leased limits of rs from their leases (with leases),
// then the others with send, and gives the leased tokens back when the work
// did not commit.
func (l *Limiter[TTx]) commit(ctx context.Context, leases bool, rs []request, obs *observation, send func(driver.TakeAllParams) (driver.TakeAllResult, error)) (MultiResult, error) {
	results := make([]Result, len(rs))
	var got []leased
	var gotFrom []int
	var stored []request // the limits the store takes
	var storedAt []int
	giveBack := func() error {
		for i, g := range got {
			if err := l.giveBack(ctx, rs[gotFrom[i]], g); err != nil {
				return err
			}
		}
		return nil
	}
	for i, r := range rs {
		// Only Commit takes from leases, before its transaction begins:
		// under CommitTx and SendBatch a lease's transaction would wait for
		// the caller's (SQLite's one writer, or the pool's last connection).
		if r.config.Lease == 0 || !leases {
			stored, storedAt = append(stored, r), append(storedAt, i)
			continue
		}
		r.obs = obs
		res, g, err := l.fromLease(ctx, r)
		if err == nil && !res.OK {
			return l.deniedByLease(ctx, rs, i, res, giveBack)
		}
		if err != nil {
			if gerr := giveBack(); gerr != nil {
				err = errors.Join(err, gerr)
			}
			return MultiResult{}, err
		}
		results[i], got, gotFrom = res, append(got, g), append(gotFrom, i)
	}
	var p driver.TakeAllParams // none to take: the store only commits
	if len(stored) > 0 {
		p = takeAllParams(stored, obs)
	}
	all, err := send(p)
	if (err != nil && !errors.Is(err, ErrCommitUnknown)) || (err == nil && !all.OK) {
		// The transaction did not commit: the leased tokens were not spent.
		if gerr := giveBack(); gerr != nil {
			err = errors.Join(err, gerr)
		}
	}
	if err != nil {
		return MultiResult{}, err
	}
	out, err := multiResult(stored, all, obs)
	if err != nil {
		return MultiResult{}, err
	}
	for j, i := range storedAt {
		results[i] = out.Results[j]
	}
	if !out.OK {
		for i := range results {
			results[i].Taken = 0
		}
	}
	out.Results = results
	if out.At.IsZero() {
		out.At = time.Now()
	}
	return out, nil
}

// deniedByLease is the MultiResult of a commit whose leased limit denied
// (res): the tokens handed out before it go back, and every other limit
// gets what Check would say.
func (l *Limiter[TTx]) deniedByLease(ctx context.Context, rs []request, denied int, res Result, giveBack func() error) (MultiResult, error) {
	if err := giveBack(); err != nil {
		return MultiResult{}, err
	}
	out := MultiResult{Results: make([]Result, len(rs)), RetryAfter: res.RetryAfter, At: res.At}
	for i, r := range rs {
		if i == denied {
			out.Results[i] = res
			continue
		}
		checked, err := in(ctx, l, nil, true, func(tx TTx) (Result, error) { return l.check(ctx, tx, r) })
		if err != nil {
			return MultiResult{}, err
		}
		checked.Taken = 0 // nothing was taken
		out.Results[i] = checked
		if !checked.OK {
			out.RetryAfter = max(out.RetryAfter, checked.RetryAfter)
		}
	}
	return out, nil
}

// The calls whose work is fixed before the limits are taken.
const (
	atCommit = "at commit, after the work has run"
	inBatch  = "in a batch, whose statements are queued already"
)

// checkFixedWork rejects the options that decide what the work is to be,
// in a call whose work is fixed already.
func (r request) checkFixedWork(when string) error {
	switch {
	case r.slot():
		return &InvalidError{Limit: r.name, Field: "Kind", Problem: "Concurrency does not apply " + when + ": " +
			"a slot guards the work that runs after it is acquired; acquire it with LimitTx (or LimitAllTx) before the work"}
	case r.reserve:
		return &InvalidError{Limit: r.name, Field: "Reserve", Problem: "does not apply " + when + ": " +
			"a reservation tells when to run the work; take it with LimitTx before the work"}
	case r.upTo:
		return &InvalidError{Limit: r.name, Field: "UpTo", Problem: "does not apply " + when + ": " +
			"the work's size is fixed by then; pass it as Count, or take UpTo with LimitTx before the work"}
	case r.idempotency != nil:
		return refuseIdempotent(r.name, "a take "+when+": its result is decided with the COMMIT, too late to record "+
			"it for a repeat; take with LimitAllTx (or LimitTx) in the transaction, then commit it")
	}
	return nil
}
