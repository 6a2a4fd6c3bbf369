package pgproto

import "errors"

// The SQLSTATEs the stores name, as PostgreSQL's errcodes table (Appendix A)
// names them. They are spelled out here rather than imported from
// github.com/jackc/pgerrcode to keep a user's module graph one module
// smaller.
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

// RetryableState reports whether a transaction that failed with SQLSTATE
// code may be run again from BEGIN: a serialization failure, a deadlock, a
// lock or statement timeout, the server shutting down or refusing
// connections, or a connection exception (class 08).
func RetryableState(code string) bool {
	switch code {
	case SerializationFailure, DeadlockDetected, LockNotAvailable, QueryCanceled,
		AdminShutdown, CrashShutdown, CannotConnectNow, TooManyConnections:
		return true
	}
	return len(code) == 5 && code[:2] == "08"
}
