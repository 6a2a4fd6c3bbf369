package pgsqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// RunTxAttempts is how many times RunTx runs fn at most.
const RunTxAttempts = 5

// RunTx runs fn in a transaction begun on db with opts and commits it, and
// runs the whole transaction again, from BEGIN, when it fails with an error
// after which that is safe (Retryable: a serialization failure under
// REPEATABLE READ or SERIALIZABLE, a deadlock, a lock or statement timeout,
// a connection lost before COMMIT, a failure to connect). It is pgstore.RunTx for *sql.Tx: at
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
	return sqltx.RunTx(ctx, "pgsqlstore: RunTx", RunTxAttempts, db, opts, fn, Retryable,
		func(err error) error { return beginErr(ctx, err) },
		func(err error) bool { _, ok := pgproto.SQLState(err); return ok })
}
