package txlimit

import (
	"context"

	"github.com/txlimit/txlimit/internal/driver"
)

// The take in the caller's batch is pgstore.SendBatch, in the store that can
// serve it; the Limiter's side of it is here, reached through
// driver.TakeInBatch, since pgstore cannot call the Limiter's unexported
// methods.
func init() {
	driver.TakeInBatch = func(ctx context.Context, limiter any, reqs any, send func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error)) (any, error) {
		l, ok := limiter.(batchTaker)
		if !ok || isNil(limiter) {
			return MultiResult{}, &InvalidError{Field: "limiter", Problem: "is nil; pass the *txlimit.Limiter built with txlimit.New"}
		}
		return l.takeInBatch(ctx, reqs.([]Request), send)
	}
}

// batchTaker is every *Limiter, whatever its transaction type.
type batchTaker interface {
	takeInBatch(ctx context.Context, reqs []Request, send func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error)) (MultiResult, error)
}

// takeInBatch takes reqs as pgstore.SendBatch documents: all or none, the
// work (the caller's batch) fixed already, a denial returned as the error;
// send sends the takes and the batch on the Limiter's store.
func (l *Limiter[TTx]) takeInBatch(ctx context.Context, reqs []Request, send func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error)) (MultiResult, error) {
	return l.takeWith(ctx, opBatch, inBatch, reqs, false, func(p driver.TakeAllParams) (driver.TakeAllResult, error) {
		return send(l.store, p)
	})
}
