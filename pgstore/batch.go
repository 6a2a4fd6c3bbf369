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
// Limiter.LimitAllTx takes them, ahead of the statements queued in b, the
// caller's own batch, and then runs those statements in tx, in their order,
// with their own callbacks. It is for work that must not run without its
// tokens, as with LimitTx, without a round trip for the take: the takes and
// b's statements go to the server together, and a take that would grant
// nothing stops the batch there, before any of b's statements takes effect.
// The caller then commits tx: the tokens are spent if and only if tx
// commits. The limits' rows stay locked until tx ends, as LimitTx's do:
// send the batch late in the transaction. It is pgstore's because pgx is
// the driver that pipelines; on the database/sql stores, take the limits
// with LimitTx or LimitAllTx before the statements.
//
// The error is nil if and only if every limit granted and b's statements
// ran. A denial returns the MultiResult (OK false; each Result is what
// Check would say of its limit) and its Err, a *txlimit.RateLimitedError
// with the RetryAfter: none of b's statements took effect and none of their
// callbacks was called, and tx has been rolled back (pgx's Rollback then
// returns pgx.ErrTxClosed). An error of b's statements (a callback's, or
// the server's) is returned as it is, after the takes: roll tx back and the
// tokens come back with it. Bad input is a *txlimit.InvalidError returned
// before anything is sent, tx left as it was: a nil b, and Reserve and UpTo
// (a reservation tells when to run work that is queued already, and UpTo's
// grant cannot size statements queued already; take them with LimitTx
// before the work). After any other error, roll tx back. SendBatch never
// fails open.
//
// When every limit is an unsharded token bucket or fixed window, the takes
// are the first statements of the batch, sent as Limiter.CommitTx sends
// them with its COMMIT, so that the whole call is one round trip. Other
// limits are taken first as LimitAllTx takes them, and b is sent once they
// granted. A limit with Config.Lease is taken from its row, as under
// CommitTx. A savepoint (tx.Begin) is refused for tx, since a denial rolls
// back the whole transaction. docs/commit.md compares the modes.
func SendBatch(ctx context.Context, l *txlimit.Limiter[pgx.Tx], tx pgx.Tx, b *pgx.Batch, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
	if b == nil {
		return txlimit.MultiResult{}, &txlimit.InvalidError{Field: "batch", Problem: "is nil; pass the batch whose " +
			"statements the limits guard (an empty one takes the limits alone)"}
	}
	res, err := driver.TakeInBatch(ctx, l, reqs, func(ops any, p driver.TakeAllParams) (driver.TakeAllResult, error) {
		// A *txlimit.Limiter[pgx.Tx] is one on pgstore: the only store of
		// that transaction type.
		return ops.(*backend).sendBatch(ctx, tx, b, p)
	})
	return res.(txlimit.MultiResult), err
}

// sendBatch takes p in tx ahead of b's statements. When every take is one
// statement the takes are queued ahead of b's statements in one batch, sent
// with tx.SendBatch and closed, so that b's callbacks run
// (pgproto.TakeBatch); the others are taken as TakeAll takes them, and b
// is then sent as it is. b itself is not changed. A denial, or an error of
// the takes, rolls tx back (it could not commit: after a denial the server
// has rolled it back already, and pgx's Rollback then ends its own
// bookkeeping and gives a pool's connection back); an error of b's
// statements is returned as it is, tx left to the caller. A context done
// before anything is sent returns its error, tx left as it was.
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
