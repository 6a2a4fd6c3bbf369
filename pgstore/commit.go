package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// Commit implements driver.Ops. pgx still counts tx open after a COMMIT it
// did not send itself: tx is rolled back at the end (the server answers with
// a warning) to end pgx's bookkeeping and give a pool's connection back, the
// round trip InTxCommit saves.
func (s *backend) Commit(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	if nested(tx) {
		return driver.TakeAllResult{}, errors.New("txlimit/pgstore: CommitTx needs the transaction itself, not one begun " +
			"inside it with Begin (a savepoint, which its COMMIT would not end but commit the outer transaction with): " +
			"pass the outer pgx.Tx")
	}
	res, err := s.commit(ctx, tx, p)
	_ = tx.Rollback(ctx)
	return res, err
}

// InTxCommit implements driver.Ops. The transaction is begun on a
// connection the store acquires for it, which goes back to the pool after
// the COMMIT with no round trip of pgx's own.
func (s *backend) InTxCommit(ctx context.Context, fn func(tx pgx.Tx) error, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	if s.pool == nil {
		return driver.TakeAllResult{}, driver.ErrNoPool
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return driver.TakeAllResult{}, mapErr(err)
	}
	// Release destroys a connection left in a transaction or broken.
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return driver.TakeAllResult{}, mapErr(err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback(ctx)
		}
	}()
	if err := fn(tx); err != nil {
		return driver.TakeAllResult{}, err
	}
	done = true
	return s.commit(ctx, tx, p)
}

// commit takes p in tx and ends tx's transaction on the server, sending
// one-statement takes with the COMMIT (pgproto.TakeCommit).
func (s *backend) commit(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	if pgproto.Lean(p) {
		res, err := s.Proto.TakeCommit(ctx, tx, p)
		return res, mapErr(err)
	}
	res, err := s.Proto.TakeAll(ctx, tx, p)
	if err != nil || !res.OK {
		_ = tx.Rollback(ctx)
		return res, mapErr(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return driver.TakeAllResult{}, commitErr(err)
	}
	return res, nil
}

// commitErr is the error of a failed COMMIT, matching
// driver.ErrCommitUnknown unless the server rolled it back or never got it.
func commitErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) {
		return mapErr(err)
	}
	return fmt.Errorf("%w: %w", driver.ErrCommitUnknown, err)
}

// nested reports whether tx is a savepoint in another pgx transaction.
func nested(tx pgx.Tx) bool { return fmt.Sprintf("%T", tx) == "*pgx.dbSimulatedNestedTx" }
