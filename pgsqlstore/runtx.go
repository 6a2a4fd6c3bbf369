package pgsqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// RunTxAttempts is how many times RunTx runs fn at most.
const RunTxAttempts = 5

// RunTx is pgstore.RunTx for *sql.Tx: it runs fn in a transaction begun on
// db with opts and commits it, and runs the whole transaction again, up to
// RunTxAttempts runs, when it fails with an error Retryable accepts. fn
// may run more than once: it must do nothing outside the transaction that
// a second run would repeat, or do it idempotently.
//
// An error from COMMIT is retried only when the server reported it (a
// SQLSTATE: nothing committed). After any other COMMIT error (a lost
// connection) the transaction may or may not have committed: RunTx returns
// it at once.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	return sqltx.RunTx(ctx, "pgsqlstore: RunTx", RunTxAttempts, db, opts, fn, Retryable,
		func(err error) error { return beginErr(ctx, err) },
		func(err error) bool { _, ok := pgproto.SQLState(err); return ok })
}
