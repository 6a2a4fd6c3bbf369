package txlimit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// Request is one limit of a LimitAll call: its name, key and the options
// LimitTx would take for it, with the same defaults:
//
//	txlimit.Request{Name: "send", Key: user, Options: []txlimit.Option{txlimit.Count(3)}}
type Request struct {
	Name    string
	Key     string
	Options []Option
}

// MultiResult is the outcome of LimitAll.
type MultiResult struct {
	// OK reports whether every limit granted its tokens, and so whether
	// they were all taken. When it is false, nothing was taken.
	OK bool
	// RetryAfter is, when OK is false, the longest RetryAfter among the
	// limits that denied: when every one of them would grant the same
	// request. When OK is true, it is the longest among the reservations
	// (0 when there is none): when the reserved work may run.
	RetryAfter time.Duration
	// Results has one Result per request, in their order. Results[i].OK
	// reports whether that limit alone grants; when the MultiResult is not
	// OK, none took anything, and each Remaining is what the limit holds.
	Results []Result
	At      time.Time // the clock reading every decision was made at
}

// Err returns nil when m is OK (reservations included) and otherwise the
// *RateLimitedError of the denied limit with the longest RetryAfter (the
// first of them in request order on a tie), whose RetryAfter is m's.
func (m MultiResult) Err() error {
	if m.OK {
		return nil
	}
	worst := -1
	for i, r := range m.Results {
		if !r.OK && (worst < 0 || r.RetryAfter > m.Results[worst].RetryAfter) {
			worst = i
		}
	}
	if worst < 0 { // a MultiResult not made by LimitAll
		return &RateLimitedError{RetryAfter: m.RetryAfter}
	}
	return m.Results[worst].Err()
}

// LimitAll is LimitAllTx in a short transaction of its own. With
// Options.FailOpen, a failure of the store grants the call (see Options):
// the MultiResult is OK with FailedOpen set on every Result.
func (l *Limiter[TTx]) LimitAll(ctx context.Context, reqs ...Request) (MultiResult, error) {
	return l.limitAllIn(ctx, nil, reqs)
}

// finishAll is finish for a LimitAll call: one Event per limit, or one with
// the error when the call failed without results.
func (l *Limiter[TTx]) finishAll(ctx context.Context, op string, obs *observation, rs []request, res MultiResult, err error, mayFailOpen bool) (MultiResult, error) {
	failedOpen := mayFailOpen && l.failOpen(err)
	switch {
	case failedOpen:
		res = MultiResult{OK: true, Results: make([]Result, len(rs)), At: time.Now()}
		for i, r := range rs {
			res.Results[i] = r.failedOpen(res.At)
		}
	case err != nil:
		res = MultiResult{}
	}
	res.At = res.At.UTC()
	for i := range res.Results {
		res.Results[i].At = res.Results[i].At.UTC()
	}
	if obs != nil {
		if len(res.Results) != len(rs) {
			l.report(ctx, obs, op, request{}, Result{}, err, false)
		}
		for i := range res.Results {
			one := res.Results[i]
			// A denied call took nothing from any limit.
			one.OK = one.OK && res.OK
			l.report(ctx, obs, op, rs[i], one, err, failedOpen)
		}
	}
	if failedOpen {
		return res, nil
	}
	return res, err
}

// LimitAllTx checks several limits at once and consumes all of them or none:
// when every limit has the tokens (or grants them as a reservation), each
// one's are taken in tx; when any limit denies, nothing is taken, and the
// MultiResult names the limits that denied. As with LimitTx, the tokens are
// spent if and only if tx commits, and a denial is not an error.
//
// Every row of every limit is locked, waiting for other transactions, in one
// canonical order (name, then key, byte by byte, then shard), so that two
// LimitAllTx calls on the same limits never deadlock on them. A sharded
// limit is locked whole here: use LimitTx for a single hot sharded limit.
// The locks are held until tx ends, so do not then take the same limits in
// another order in the same transaction. Each (name, key) may appear once:
// give one request the sum of the counts. Bad input in any request is an
// *InvalidError before anything is read or written.
//
// A Concurrency limit's slot is acquired with the others, all or none: its
// key's lock row is locked before any row of a rate limit, a denied rate
// limit leaves no holder, and a full Concurrency limit takes no token.
func (l *Limiter[TTx]) LimitAllTx(ctx context.Context, tx TTx, reqs ...Request) (MultiResult, error) {
	return l.limitAllIn(ctx, &tx, reqs)
}

func (l *Limiter[TTx]) limitAllIn(ctx context.Context, tx *TTx, reqs []Request) (MultiResult, error) {
	obs := l.observe()
	rs, err := l.newRequests(reqs)
	var k *idempotency
	if err == nil {
		k, err = idempotencyOf(rs)
	}
	var res MultiResult
	if err == nil {
		res, err = in(ctx, l, tx, false, func(tx TTx) (MultiResult, error) {
			if k == nil {
				return l.takeAll(ctx, tx, rs, obs)
			}
			return once(ctx, l, tx, k, "LimitAll", rs, func() (MultiResult, error) { return l.takeAll(ctx, tx, rs, obs) },
				func(m MultiResult) bool { return m.OK }, func(m *MultiResult) {
					for i := range m.Results {
						m.Results[i].Repeat = true
					}
				})
		})
	}
	return l.finishAll(ctx, opLimitAll, obs, rs, res, err, tx == nil)
}

// takeAll takes the limits of rs in tx, all or none.
func (l *Limiter[TTx]) takeAll(ctx context.Context, tx TTx, rs []request, obs *observation) (MultiResult, error) {
	if slices.ContainsFunc(rs, request.slot) {
		return l.acquireAll(ctx, tx, rs, obs)
	}
	all, err := l.store.TakeAll(ctx, tx, takeAllParams(rs, obs))
	if err != nil {
		return MultiResult{}, err
	}
	return multiResult(rs, all, obs)
}

// newRequests validates every request of a LimitAll call.
func (l *Limiter[TTx]) newRequests(reqs []Request) ([]request, error) {
	if len(reqs) == 0 {
		return nil, &InvalidError{Field: "reqs", Problem: "is empty; pass at least one Request"}
	}
	rs := make([]request, len(reqs))
	seen := make(map[driver.KeyRef]int, len(reqs))
	for i, q := range reqs {
		r, err := l.newRequest(q.Name, q.Key, q.Options, nil)
		if err == nil {
			err = r.checkCount()
		}
		if err == nil && r.slot() {
			err = r.acquiring()
		}
		if err != nil {
			return nil, err
		}
		k := driver.KeyRef{Name: q.Name, Key: q.Key}
		if j, dup := seen[k]; dup {
			return nil, &InvalidError{Limit: q.Name, Field: "reqs", Problem: fmt.Sprintf(
				"holds key %q twice (requests %d and %d); make them one request with the sum of their counts", q.Key, j, i)}
		}
		seen[k] = i
		rs[i] = r
	}
	return rs, nil
}

// takeAllParams is the store's TakeAll for rs, on the first request's clock.
func takeAllParams(rs []request, obs *observation) driver.TakeAllParams {
	p := driver.TakeAllParams{Takes: make([]driver.TakeParams, len(rs)), Now: rs[0].now, TimeLocks: obs != nil}
	for i, r := range rs {
		r.now = p.Now
		p.Takes[i] = r.take()
	}
	return p
}

// multiResult is the MultiResult of what the store decided for rs.
func multiResult(rs []request, all driver.TakeAllResult, obs *observation) (MultiResult, error) {
	obs.addLockWait(all.LockWait)
	out := MultiResult{OK: all.OK, Results: make([]Result, len(rs)), At: all.At}
	for i, t := range all.Results {
		var err error
		if out.Results[i], err = rs[i].result(t); err != nil {
			return MultiResult{}, err
		}
		if !out.OK {
			out.Results[i].Taken = 0 // nothing was taken from any limit
		}
		if out.Results[i].OK == out.OK {
			// The longest wait among the denials, or among the
			// reservations of a grant.
			out.RetryAfter = max(out.RetryAfter, out.Results[i].RetryAfter)
		}
	}
	return out, nil
}
