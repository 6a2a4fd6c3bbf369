package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/internal/sqltx"
)

// RunTxAttempts is how many times RunTx runs fn at most.
const RunTxAttempts = 5

// RunTx is pgstore.RunTx for MySQL: it runs fn in a transaction begun on
// db with opts and commits it, and runs the whole transaction again, up to
// RunTxAttempts runs, when it fails with an error Retryable accepts (a
// deadlock, on Galera a conflict found at COMMIT, a lock wait timeout, a
// connection lost before COMMIT, a failure to connect). fn may run more
// than once: it must do nothing outside the transaction that a second run
// would repeat, or do it idempotently.
//
// An error from COMMIT is retried only when the server reported it (a MySQL
// error number: nothing committed, as when Galera's certification refuses
// it with 1213). After any other COMMIT error (a lost connection) the
// transaction may or may not have committed: RunTx returns it at once.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	return sqltx.RunTx(ctx, "mysqlstore: RunTx", RunTxAttempts, db, opts, fn, Retryable,
		func(err error) error { return &beginError{err} },
		func(err error) bool { _, ok := errNumber(err); return ok })
}
