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
//   - serialization failure (40001) under REPEATABLE READ or SERIALIZABLE,
//     and deadlock (40P01);
//   - lock_timeout (55P03) or statement_timeout (57014) hit while waiting
//     for a busy limit;
//   - the connection lost or the server shutting down or restarting (class
//     08, 57P01–57P03, 53300 too many connections, a network error, or an
//     error pgx reports as sent before anything reached the server);
//   - a failure to connect (*pgconn.ConnectError), such as a refused
//     connection or, during a failover with target_session_attrs=read-write,
//     "read only connection" from a host that is no longer the primary;
//     except when the server refused the login itself: authentication or
//     role (class 28) and a database that does not exist (3D000), which no
//     retry cures.
//
// The transaction did not commit in any of these cases, so no token was
// spent. Context cancellation and deadlines are not retryable: the caller
// gave up. Bad input (a *txlimit.InvalidError) is not retryable.
//
// The classification is pgsqlstore.Retryable's too (package pgproto).
//
// An error from COMMIT itself on a lost connection is different: the commit
// may or may not have happened, and neither pgx nor txlimit can tell. Retry
// such a transaction only when the business write is idempotent.
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
