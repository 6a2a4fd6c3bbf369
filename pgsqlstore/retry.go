package pgsqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"

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
//     08, 57P01–57P03, 53300 too many connections, driver.ErrBadConn, a
//     network error).
//
// It reads the SQLSTATE through the SQLState method that both lib/pq's
// *pq.Error and pgx's *pgconn.PgError have, so it works with either driver
// and imports neither. The transaction did not commit in any of these
// cases, so no token was spent. Context cancellation and deadlines are not
// retryable: the caller gave up. Bad input (txlimit.ErrInvalid) is not
// retryable.
//
// An error from COMMIT itself on a lost connection is different: the commit
// may or may not have happened, and neither the driver nor txlimit can tell.
// Retry such a transaction only when the business write is idempotent.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if code, ok := pgproto.SQLState(err); ok {
		return pgproto.RetryableState(code)
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}
