package pgsqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
)

// ErrWrongDatabase matches (errors.Is) the error of a call on a *sql.DB or
// *sql.Tx that is not PostgreSQL. Its message names the database found and
// the store to use instead.
var ErrWrongDatabase = errors.New("txlimit/pgsqlstore: the database is not PostgreSQL")

// wrongDatabase is called with an error that carries no SQLSTATE, which
// PostgreSQL always sends: it asks q, where the failed statement ran,
// which database it is, and returns nil when that is PostgreSQL or cannot
// be told (a lost connection, a cancelled context).
func wrongDatabase(ctx context.Context, q querier, cause error) error {
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) ||
		errors.Is(cause, driver.ErrBadConn) || errors.Is(cause, sql.ErrTxDone) || errors.Is(cause, sql.ErrConnDone) ||
		errors.Is(cause, io.EOF) || errors.Is(cause, io.ErrUnexpectedEOF) {
		return nil
	}
	var netErr net.Error
	if errors.As(cause, &netErr) {
		return nil
	}
	var version string
	if q.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version) == nil {
		return fmt.Errorf("%w: it is SQLite %s; use sqlitestore.New(db) for SQLite (the store's statement failed: %w)",
			ErrWrongDatabase, version, cause)
	}
	if q.QueryRowContext(ctx, "SELECT @@version").Scan(&version) == nil {
		return fmt.Errorf("%w: it is MySQL or MariaDB (%s), which pgsqlstore does not support (the store's statement failed: %w)",
			ErrWrongDatabase, version, cause)
	}
	return nil
}
