package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// RunTxAttempts is how many times RunTx runs fn at most.
const RunTxAttempts = 5

// RunTx runs fn in a transaction begun on db with opts and commits it, and
// runs the whole transaction again, from BEGIN, when it fails with an error
// after which that is safe (Retryable: a serialization failure under
// REPEATABLE READ or SERIALIZABLE, a deadlock, a lock or statement timeout,
// a connection lost before COMMIT). It is pgstore.RunTx for *sql.Tx: at
// most RunTxAttempts runs, a backoff that doubles from 10ms between them
// (each drawn from its upper half), and any other error (fn's own, bad
// input, a cancelled context) returned at once, after the rollback.
//
// fn may run more than once: it must do nothing outside the transaction that
// a second run would repeat, or do it idempotently. A denial by LimitTx is
// not an error and is not retried; return Result.Err from fn to roll the
// transaction back.
//
// An error from COMMIT is retried only when the server reported it (it
// carries a SQLSTATE: the transaction did not commit). Any other COMMIT
// error (a lost connection) leaves the transaction's fate unknown; RunTx
// returns it at once, never running fn again.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := runTx(ctx, db, opts, fn)
		var ambiguous *commitError
		switch {
		case errors.As(err, &ambiguous):
			return ambiguous.err
		case err == nil || !Retryable(err):
			return err
		case attempt == RunTxAttempts:
			return fmt.Errorf("pgsqlstore: RunTx: gave up after %d attempts: %w", attempt, err)
		}
		wait := txlimit.Jitter(backoff/2, backoff/2)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
		backoff *= 2
	}
}

// runTx is one run of RunTx.
func runTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		if _, ok := pgproto.SQLState(err); ok {
			return err // the server rolled it back
		}
		return &commitError{err: fmt.Errorf("pgsqlstore: RunTx: COMMIT failed, and the transaction may or may not have committed: %w", err)}
	}
	return nil
}

// commitError marks an error from COMMIT after which the transaction's fate
// is unknown.
type commitError struct{ err error }

func (e *commitError) Error() string { return e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }
