package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/retrytx"
)

// TxBeginner begins a transaction: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx
// (whose BeginTx opens a savepoint).
type TxBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// RunTxAttempts is how many times RunTx runs fn at most.
const RunTxAttempts = 5

// RunTx runs fn in a transaction begun on db with txOptions and commits it,
// as pgx.BeginTxFunc does, and runs the whole transaction again when it
// fails with an error Retryable accepts, up to RunTxAttempts runs. Any
// other error (fn's own, bad input, a cancelled context) is returned at
// once, after the rollback. Between runs it waits a backoff that doubles
// from 10ms, each drawn uniformly from its upper half, and it stops when
// ctx ends or its deadline would pass in the wait.
//
// fn may run more than once: it must do nothing outside the transaction that
// a second run would repeat (send an email, charge a card), or do it
// idempotently. A denial by LimitTx is not an error and is not retried;
// return Result.Err from fn to roll the transaction back.
//
// An error from COMMIT is retried when the server reported it (nothing
// committed) or pgx knows the COMMIT never reached the server. When the
// connection is lost during COMMIT, the transaction may or may not have
// committed: RunTx returns that error at once.
func RunTx(ctx context.Context, db TxBeginner, txOptions pgx.TxOptions, fn func(pgx.Tx) error) error {
	return retrytx.Run(ctx, "pgstore: RunTx", RunTxAttempts, Retryable, func() error {
		tx, err := db.BeginTx(ctx, txOptions)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			if err = commitErr(err); errors.Is(err, driver.ErrCommitUnknown) {
				return &retrytx.Ambiguous{Err: fmt.Errorf("pgstore: RunTx: %w", err)}
			}
			return err
		}
		return nil
	})
}
