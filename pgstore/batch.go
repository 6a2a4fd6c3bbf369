package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// SendBatch takes the limits of reqs in tx, all or none as
// Limiter.LimitAllTx does, ahead of the statements queued in b, and then
// runs b's statements in tx, in order, with their callbacks: for work that
// must not run without its tokens, with no round trip for the take (pgx
// pipelines; on the database/sql stores, use LimitTx before the work). The
// caller then commits tx: the tokens are spent if and only if tx commits.
// The limits' rows stay locked until tx ends: send the batch late.
//
// The error is nil if and only if every limit granted and b's statements
// ran. A denial returns the MultiResult (each Result is what Check would
// say) and its Err, a *txlimit.RateLimitedError: none of b's statements
// took effect or had its callback called, and tx has been rolled back
// (pgx's Rollback then returns pgx.ErrTxClosed). An error of b's statements
// is returned as it is: roll tx back, and the tokens come back. Bad input is
// a *txlimit.InvalidError returned before anything is sent: a nil b, and
// Reserve and UpTo, which cannot size work queued already (take them with
// LimitTx before the work). A savepoint (tx.Begin) is refused for tx, since
// a denial rolls back the whole transaction. After any other error, roll tx
// back. SendBatch never fails open.
//
// When every limit is an unsharded token bucket or fixed window, the takes
// lead the batch and the call is one round trip; other limits are taken
// first, as LimitAllTx takes them. A limit with Config.Lease is taken from
// its row. docs/commit.md compares the modes.
func SendBatch(ctx context.Context, l *txlimit.Limiter[pgx.Tx], tx pgx.Tx, b *pgx.Batch, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
	if b == nil {
		return txlimit.MultiResult{}, &txlimit.InvalidError{Field: "batch", Problem: "is nil; pass the batch whose " +
			"statements the limits guard (an empty one takes the limits alone)"}
	}
	res, err := driver.TakeInBatch(ctx, l, reqs, func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error) {
		// pgstore is the only store whose TTx is pgx.Tx.
		return ops.(*backend).sendBatch(ctx, tx, b, p)
	})
	return res.(txlimit.MultiResult), err
}

// sendBatch takes p in tx ahead of b's statements, in one batch when every
// take is one statement (pgproto.TakeBatch), and otherwise as TakeAll
// takes them before b is sent. A denial or an error of the takes rolls tx
// back (after a denial the server has already; pgx's Rollback ends its
// bookkeeping and gives a pool's connection back); an error of b's
// statements leaves tx to the caller.
func (s *backend) sendBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	if nested(tx) {
		return driver.TakeAllResult{}, errors.New("txlimit/pgstore: SendBatch needs the transaction itself, not one begun " +
			"inside it with Begin (a savepoint): a denial rolls back the whole transaction, which the savepoint's owner " +
			"does not expect; pass the outer pgx.Tx")
	}
	if err := ctx.Err(); err != nil {
		return driver.TakeAllResult{}, fmt.Errorf("txlimit/pgstore: the batch was not sent: %w", err)
	}
	var res driver.TakeAllResult
	var err, batchErr error
	if pgproto.Lean(p) {
		res, batchErr, err = s.Proto.TakeBatch(ctx, tx, p, b)
	} else if res, err = s.Proto.TakeAll(ctx, tx, p); err == nil && res.OK {
		batchErr = tx.SendBatch(ctx, b).Close()
	}
	switch {
	case err != nil:
		_ = tx.Rollback(ctx)
		return driver.TakeAllResult{}, mapErr(err)
	case !res.OK:
		_ = tx.Rollback(ctx)
		return res, nil
	}
	return res, batchErr
}
