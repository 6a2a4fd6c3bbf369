// Package sqltx is the transaction wrapper of the stores on database/sql
// (pgsqlstore, sqlitestore, mysqlstore): their driver.Store.InTx, Commit
// and InTxCommit, and the RunTx of pgsqlstore and mysqlstore.
package sqltx

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/retrytx"
)

// InTx runs fn in a new transaction on db and commits it when fn returns
// nil; it rolls back when fn returns an error or panics (the panic then
// continues). A transaction that only reads (readOnly: Check, Value) is
// begun read-only; one that writes is begun with no options, so that the
// DSN's settings decide the rest (SQLite's _txlock, say). begin and commit
// turn the errors of BeginTx and Commit into the store's. Without db it
// returns driver.ErrNoPool.
func InTx(ctx context.Context, db *sql.DB, readOnly bool, fn func(tx *sql.Tx) error, begin, commit func(error) error) error {
	return run(ctx, db, readOnly, begin, fn, func(tx *sql.Tx) error { return commit(tx.Commit()) })
}

// run begins a transaction on db, runs fn in it and then end, rolling back
// when fn fails or panics.
func run(ctx context.Context, db *sql.DB, readOnly bool, begin func(error) error, fn, end func(tx *sql.Tx) error) error {
	if db == nil {
		return driver.ErrNoPool
	}
	var opts *sql.TxOptions
	if readOnly {
		opts = &sql.TxOptions{ReadOnly: true}
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return begin(err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	done = true
	return end(tx)
}

// TakeAll is a store's driver.Store.TakeAll.
type TakeAll func(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error)

// Commit is driver.Store.Commit on database/sql, whose drivers send one
// statement at a time: takeAll in tx, then COMMIT when it granted and
// ROLLBACK otherwise, each a round trip of its own (there is none to save
// on SQLite, which has no server). commit turns the error of Commit into
// the store's; known reports whether the transaction surely did not commit
// when Commit failed with err (the database answered, or nothing was sent):
// otherwise the error matches driver.ErrCommitUnknown.
func Commit(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams, takeAll TakeAll, commit func(error) error, known func(error) bool) (driver.TakeAllResult, error) {
	res := driver.TakeAllResult{OK: true}
	var err error
	if len(p.Takes) > 0 {
		res, err = takeAll(ctx, tx, p)
	}
	if err != nil || !res.OK {
		_ = tx.Rollback()
		return res, err
	}
	if err := tx.Commit(); err != nil {
		if known(err) {
			return driver.TakeAllResult{}, commit(err)
		}
		return driver.TakeAllResult{}, fmt.Errorf("%w: %w", driver.ErrCommitUnknown, commit(err))
	}
	return res, nil
}

// InTxCommit is driver.Store.InTxCommit on database/sql: fn in a
// transaction begun as InTx begins one that writes, ended by Commit.
func InTxCommit(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error, p driver.TakeAllParams, takeAll TakeAll,
	begin, commit func(error) error, known func(error) bool,
) (res driver.TakeAllResult, err error) {
	err = run(ctx, db, false, begin, fn, func(tx *sql.Tx) (err error) {
		res, err = Commit(ctx, tx, p, takeAll, commit, known)
		return err
	})
	return res, err
}

// RunTx is the RunTx of a database/sql store (name says which, in errors):
// fn in a transaction begun on db with opts, committed, the whole of it run
// again from BEGIN, up to attempts runs, when it fails with an error
// retryable accepts (retrytx.Run). begin turns the error of BeginTx into
// the store's; answered reports whether a COMMIT that failed with err was
// refused by the database, so that nothing committed: otherwise the outcome
// is unknown, and the error is a *retrytx.Ambiguous, never run again.
func RunTx(ctx context.Context, name string, attempts int, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error,
	retryable func(error) bool, begin func(error) error, answered func(error) bool,
) error {
	return retrytx.Run(ctx, name, attempts, retryable, func() error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return begin(err)
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			if answered(err) {
				return err
			}
			return &retrytx.Ambiguous{Err: fmt.Errorf("%s: COMMIT failed, and the transaction may or may not have committed: %w", name, err)}
		}
		return nil
	})
}
