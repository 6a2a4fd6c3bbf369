package pgsqlstore

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/internal/pgproto"
)

// Retryable reports whether err, returned inside a transaction (by LimitTx or
// any other statement before COMMIT) or by BeginTx, means that running the
// whole transaction again from BEGIN is safe and may succeed, as
// pgstore.Retryable classifies errors, with either driver.
//
// lib/pq reports some failures to connect (target_session_attrs refusing a
// host) as plain errors, known as such only in the BeginTx of RunTx or of a
// transaction the limiter opens: an error of the application's own
// db.BeginTx with lib/pq is classified by its type alone (a network error
// or a SQLSTATE). An error from COMMIT on a lost connection is not
// retryable: the commit may or may not have happened.
func Retryable(err error) bool {
	var begin *beginError
	var connectErr *pgconn.ConnectError
	return pgproto.Retryable(err, errors.As(err, &begin) || errors.As(err, &connectErr))
}

// beginError is an error of BeginTx on a *sql.DB, where database/sql
// connects: no statement of the transaction has run.
type beginError struct{ err error }

func (e *beginError) Error() string { return e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }
