package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/internal/pgproto"
)

// Retryable reports whether err, returned inside a transaction (by LimitTx or
// any other statement before COMMIT), means that running the whole
// transaction again from BEGIN is safe and may succeed:
//
//   - serialization failure (40001) or deadlock (40P01);
//   - lock_timeout (55P03) or statement_timeout (57014);
//   - the connection lost or the server shutting down or restarting (class
//     08, 57P01–57P03, 53300 too many connections, a network error, or an
//     error pgx reports as sent before anything reached the server);
//   - a failure to connect (*pgconn.ConnectError), such as "read only
//     connection" from a former primary during a failover, except a login
//     the server refused (class 28) or a database that does not exist
//     (3D000).
//
// The transaction did not commit in any of these cases. Context
// cancellation, deadlines and bad input are not retryable. An error from
// COMMIT itself on a lost connection is different: the commit may or may
// not have happened; retry only a transaction whose write is idempotent.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if _, isPg := pgproto.SQLState(err); !isPg && pgconn.SafeToRetry(err) {
		return true
	}
	var connectErr *pgconn.ConnectError
	return pgproto.Retryable(err, errors.As(err, &connectErr))
}
