// Package sqltx is the transaction wrapper of the stores on database/sql
// (pgsqlstore, sqlitestore, mysqlstore): their driver.Store.InTx.
package sqltx

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/driver"
)

// InTx runs fn in a new transaction on db and commits it when fn returns
// nil; it rolls back when fn returns an error or panics (the panic then
// continues). A transaction that only reads (readOnly: Check, Value) is
// begun read-only; one that writes is begun with no options, so that the
// DSN's settings decide the rest (SQLite's _txlock, say). begin and commit
// turn the errors of BeginTx and Commit into the store's. Without db it
// returns driver.ErrNoPool.
func InTx(ctx context.Context, db *sql.DB, readOnly bool, fn func(tx *sql.Tx) error, begin, commit func(error) error) error {
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
	return commit(tx.Commit())
}
