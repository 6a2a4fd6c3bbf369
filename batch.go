package txlimit

import (
	"context"

	"github.com/txlimit/txlimit/internal/driver"
)

// The Limiter's side of pgstore.SendBatch (driver.TakeInBatch).
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

// takeInBatch takes reqs as pgstore.SendBatch documents; send sends the
// takes and the batch on the Limiter's store.
func (l *Limiter[TTx]) takeInBatch(ctx context.Context, reqs []Request, send func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error)) (MultiResult, error) {
	return l.takeWith(ctx, opBatch, inBatch, reqs, false, func(p driver.TakeAllParams) (driver.TakeAllResult, error) {
		return send(l.store, p)
	})
}
