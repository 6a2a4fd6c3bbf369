package pgsqlstore

import (
	"errors"
	"reflect"

	"github.com/txlimit/txlimit/internal/pgproto"
)

// Retryable reports whether err, returned inside a transaction (by LimitTx or
// any other statement before COMMIT) or by BeginTx, means that running the
// whole transaction again from BEGIN is safe and may succeed:
//
//   - serialization failure (40001) under REPEATABLE READ or SERIALIZABLE,
//     and deadlock (40P01);
//   - lock_timeout (55P03) or statement_timeout (57014) hit while waiting
//     for a busy limit;
//   - the connection lost or the server shutting down or restarting (class
//     08, 57P01–57P03, 53300 too many connections, driver.ErrBadConn, a
//     network error such as a refused connection);
//   - a failure to connect, such as, during a failover with
//     target_session_attrs=read-write, a host that is no longer the primary;
//     except when the server refused the login itself: authentication or
//     role (class 28) and a database that does not exist (3D000), which no
//     retry cures.
//
// A failure to connect is known as such when it is pgx's
// *pgconn.ConnectError, or when it is the error of RunTx's BeginTx or of a
// transaction the limiter opens itself (Limit, Check, …): lib/pq reports
// some of its failures to connect (target_session_attrs refusing a host) as
// plain errors, which only where they happened tells apart. An error of
// the application's own db.BeginTx with lib/pq is therefore classified by
// its type alone: a network error or SQLSTATE as above, anything else not
// retryable.
//
// It reads the SQLSTATE through the SQLState method that both lib/pq's
// *pq.Error and pgx's *pgconn.PgError have, and recognizes pgx's
// ConnectError by its type's name, so it works with either driver and
// imports neither; the classification is pgstore.Retryable's. The
// transaction did not commit in any of these cases, so no token was spent.
// Context cancellation and deadlines are not retryable: the caller gave up.
// Bad input (txlimit.ErrInvalid) is not retryable.
//
// An error from COMMIT itself on a lost connection is different: the commit
// may or may not have happened, and neither the driver nor txlimit can tell.
// Retry such a transaction only when the business write is idempotent
// (RunTx never retries it).
func Retryable(err error) bool {
	var begin *beginError
	return pgproto.Retryable(err, errors.As(err, &begin) || isPgxConnectError(err))
}

// beginError is an error of BeginTx on a *sql.DB: database/sql connects
// there, and no statement of the transaction has run. Its message is the
// driver's.
type beginError struct{ err error }

func (e *beginError) Error() string { return e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }

// pgxConnectError is the type of a failure to connect with pgx, also
// through its database/sql driver.
var pgxConnectError = struct{ pkg, name string }{"github.com/jackc/pgx/v5/pgconn", "ConnectError"}

// isPgxConnectError reports whether err's chain holds a
// *pgconn.ConnectError, without importing pgconn
// (TestDatabaseSQLRetryableConnectErrors checks the name against pgx's
// stdlib driver).
func isPgxConnectError(err error) bool {
	for err != nil {
		if t := reflect.TypeOf(err); t.Kind() == reflect.Pointer &&
			t.Elem().PkgPath() == pgxConnectError.pkg && t.Elem().Name() == pgxConnectError.name {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if isPgxConnectError(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
