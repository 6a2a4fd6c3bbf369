package pgsqlstore

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/internal/pgproto"
)

// Retryable reports whether err, returned inside a transaction (by LimitTx or
// any other statement before COMMIT) or by BeginTx, means that running the
// whole transaction again from BEGIN is safe and may succeed: the
// classification of pgstore.Retryable (a serialization failure, a deadlock,
// a lock or statement timeout, a lost connection, a failure to connect but
// for a refused login or a missing database), with either driver.
//
// A failure to connect is known as such when it is pgx's
// *pgconn.ConnectError, or when it is the error of RunTx's BeginTx or of a
// transaction the limiter opens itself (Limit, Check, …): lib/pq reports
// some of its failures to connect (target_session_attrs refusing a host) as
// plain errors, which only where they happened tells apart. An error of
// the application's own db.BeginTx with lib/pq is therefore classified by
// its type alone: a network error or SQLSTATE, anything else not
// retryable. An error from COMMIT on a lost connection is not retryable:
// the commit may or may not have happened.
func Retryable(err error) bool {
	var begin *beginError
	var connectErr *pgconn.ConnectError
	return pgproto.Retryable(err, errors.As(err, &begin) || errors.As(err, &connectErr))
}

// beginError is an error of BeginTx on a *sql.DB: database/sql connects
// there, and no statement of the transaction has run. Its message is the
// driver's.
type beginError struct{ err error }

func (e *beginError) Error() string { return e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }
