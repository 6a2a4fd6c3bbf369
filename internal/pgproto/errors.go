package pgproto

import (
	"context"
	"errors"
	"strings"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// The SQLSTATEs the stores name, as PostgreSQL's errcodes table names them,
// spelled out rather than imported from github.com/jackc/pgerrcode to keep
// a user's module graph one module smaller.
const (
	UndefinedTable             = "42P01"
	UndefinedColumn            = "42703"
	DuplicatePreparedStatement = "42P05"
	InvalidSQLStatementName    = "26000"
	SerializationFailure       = "40001"
	DeadlockDetected           = "40P01"
	LockNotAvailable           = "55P03"
	QueryCanceled              = "57014"
	AdminShutdown              = "57P01"
	CrashShutdown              = "57P02"
	CannotConnectNow           = "57P03"
	TooManyConnections         = "53300"
	InvalidCatalogName         = "3D000"
)

// SQLState returns the SQLSTATE of the first error in err's chain that
// carries one: pgx's *pgconn.PgError and lib/pq's *pq.Error both have a
// SQLState method, so neither driver is imported to read it.
func SQLState(err error) (string, bool) {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState(), true
	}
	return "", false
}

// Retryable is the classification behind pgstore.Retryable and
// pgsqlstore.Retryable: whether a transaction that failed with err may run
// again from BEGIN. connectFailed says that err is a failure to make the
// connection (pgx's *pgconn.ConnectError, or an error pgsqlstore saw come
// from BeginTx): nothing ran, and any cause is retryable but a refused
// login (class 28) and a missing database (3D000), which no retry cures.
// Without a SQLSTATE, err is retryable when the connection broke. Never
// retryable: the caller giving up (context cancellation and deadlines) and
// a COMMIT whose outcome is unknown (driver.ErrCommitUnknown), which a
// second run could do twice.
func Retryable(err error, connectFailed bool) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, driver.ErrCommitUnknown) {
		return false
	}
	code, ok := SQLState(err)
	switch {
	case connectFailed:
		return !ok || (!strings.HasPrefix(code, "28") && code != InvalidCatalogName)
	case !ok:
		return sqltx.BrokenConn(err)
	}
	switch code {
	case SerializationFailure, DeadlockDetected, LockNotAvailable, QueryCanceled,
		AdminShutdown, CrashShutdown, CannotConnectNow, TooManyConnections:
		return true
	}
	return len(code) == 5 && code[:2] == "08"
}
