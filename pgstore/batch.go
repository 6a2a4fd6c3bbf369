package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

var _ driver.BatchSender[pgx.Tx, *pgx.Batch] = (*backend)(nil)

// SendBatch implements driver.BatchSender for a *pgx.Batch. When every take
// is one statement (an unsharded token bucket or fixed window)
// the takes are queued ahead of b's statements in one batch, sent
// with tx.SendBatch and closed, so that b's callbacks run
// (pgproto.TakeBatch); the others are taken as TakeAll takes them, and b
// is then sent as it is. b itself is not changed. A denial, or an error of
// the takes, rolls tx back (it could not commit: after a denial the server
// has rolled it back already, and pgx's Rollback then ends its own
// bookkeeping and gives a pool's connection back); an error of b's
// statements is returned as it is, tx left to the caller. A context done
// before anything is sent returns its error, tx left as it was.
func (s *backend) SendBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, p driver.TakeAllParams) (driver.TakeAllResult, error) {
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
		res, batchErr, err = s.proto.TakeBatch(ctx, tx, p, b)
	} else if res, err = s.proto.TakeAll(ctx, tx, p); err == nil && res.OK {
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
