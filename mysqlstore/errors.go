package mysqlstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// The MySQL and MariaDB error numbers the store names.
const (
	errNoSuchTable      = 1146 // ER_NO_SUCH_TABLE
	errBadField         = 1054 // ER_BAD_FIELD_ERROR
	errLockWaitTimeout  = 1205 // ER_LOCK_WAIT_TIMEOUT
	errLockDeadlock     = 1213 // ER_LOCK_DEADLOCK, also a Galera certification conflict
	errTooManyConns     = 1040 // ER_CON_COUNT_ERROR
	errServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	errQueryInterrupted = 1317 // ER_QUERY_INTERRUPTED (KILL QUERY, a server shutting down)
	errUnknownCommand   = 1047 // ER_UNKNOWN_COM_ERROR: a Galera node not synced ("WSREP has not yet prepared node")
	errBadDB            = 1049 // ER_BAD_DB_ERROR
	errAccessDenied     = 1045 // ER_ACCESS_DENIED_ERROR
	errDBAccessDenied   = 1044 // ER_DBACCESS_DENIED_ERROR
)

// mysqlErrorType is the error type of github.com/go-sql-driver/mysql, whose
// Number field is the server's error number. The store reads it by
// reflection so that it imports no driver (TestDeadlockIsRetryable and
// TestLockWaitTimeoutIsRetryable, on a real server, hold the name to the
// driver's).
var mysqlErrorType = struct{ pkg, name string }{"github.com/go-sql-driver/mysql", "MySQLError"}

// errNumber returns the server's error number of the first MySQL error in
// err's chain.
func errNumber(err error) (uint16, bool) {
	if v := reflect.ValueOf(err); v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		t, f := v.Elem().Type(), v.Elem().FieldByName("Number")
		if t.PkgPath() == mysqlErrorType.pkg && t.Name() == mysqlErrorType.name && f.CanUint() {
			return uint16(f.Uint()), true
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return errNumber(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if n, ok := errNumber(e); ok {
				return n, true
			}
		}
	}
	return 0, false
}

// ErrWrongDatabase matches (errors.Is) the error of a call on a *sql.DB or
// *sql.Tx that is not MySQL or MariaDB. Its message names the database found
// and the store to use instead.
var ErrWrongDatabase = errors.New("txlimit/mysqlstore: the database is not MySQL or MariaDB")

// ErrDSN matches (errors.Is) the error of Ping, or of a call, on a *sql.DB
// opened with a DSN that lacks a setting the store needs; the message names
// the DSN parameter to set (see the package documentation).
var ErrDSN = errors.New("txlimit/mysqlstore: the DSN lacks a setting the store needs")

// wrap adds to err what the caller must do about it, keeping the driver's
// error reachable with errors.As. q, when not nil, is where the failed
// statement ran: an error that carries no MySQL error number is checked
// there for a database that is not MySQL (sqltx.WrongDatabase).
func wrap(ctx context.Context, q sqltx.Querier, op string, err error) error {
	if err == nil {
		return nil
	}
	n, ok := errNumber(err)
	if !ok {
		if isDSNError(err) {
			return err
		}
		if strings.Contains(err.Error(), "unsupported Scan, storing driver.Value type []uint8 into type *time.Time") {
			return dsnError("add parseTime=true to the DSN: the store reads DATETIME columns as time.Time (%s: %w)", op, err)
		}
		if wrong := sqltx.WrongDatabase(ctx, q, err, ErrWrongDatabase, sqltx.MySQL); wrong != nil {
			return wrong
		}
		return fmt.Errorf("txlimit/mysqlstore: %s: %w", op, err)
	}
	switch n {
	case errNoSuchTable, errBadField:
		return fmt.Errorf("txlimit/mysqlstore: %s: %w: %w", op, driver.ErrNotMigrated, err)
	case errLockDeadlock:
		return fmt.Errorf("txlimit/mysqlstore: %s: the server rolled the whole transaction back (a deadlock, or on Galera a "+
			"conflicting commit on another node); run it again from BEGIN (mysqlstore.RunTx does): %w", op, err)
	case errLockWaitTimeout:
		return fmt.Errorf("txlimit/mysqlstore: %s: a row of the limit stayed locked longer than innodb_lock_wait_timeout; "+
			"only the statement was undone, so roll the transaction back and run it again (mysqlstore.RunTx does): %w", op, err)
	}
	return fmt.Errorf("txlimit/mysqlstore: %s: %w", op, err)
}

// dsnError is an ErrDSN naming what to set, a mistake of the setup
// (driver.Setup) on which txlimit.Options.FailOpen never grants.
func dsnError(format string, args ...any) error {
	return driver.Setup(fmt.Errorf("%w: "+format, append([]any{ErrDSN}, args...)...))
}

// isDSNError reports whether err is one of the store's own DSN errors.
func isDSNError(err error) bool { return errors.Is(err, ErrDSN) || errors.Is(err, ErrWrongDatabase) }

// Retryable reports whether err, returned inside a transaction (by LimitTx or
// any other statement before COMMIT) or by BeginTx, means that running the
// whole transaction again from BEGIN is safe and may succeed:
//
//   - a deadlock (1213), which the server resolves by rolling one
//     transaction back, and on Galera a conflict with a transaction that
//     committed first on another node, reported as the same error by the
//     statement or the COMMIT that found it;
//   - a lock wait timeout (1205): the statement was undone but the
//     transaction is open (innodb_rollback_on_timeout is off by default),
//     so roll it back before running it again;
//   - the server going away: too many connections (1040), shutting down
//     (1053), a query interrupted (1317), a Galera node that is not synced
//     (1047), or a connection that broke before COMMIT;
//   - a failure to connect, except when the server refused the login (1044,
//     1045) or the database does not exist (1049), which no retry cures.
//
// The transaction did not commit in any of these cases, so no token was
// spent. Context cancellation and deadlines are not retryable (the caller
// gave up), nor is bad input (a *txlimit.InvalidError), a setting missing
// from the DSN (ErrDSN) or a database that is not MySQL (ErrWrongDatabase).
//
// An error from COMMIT itself on a lost connection is different: the commit
// may or may not have happened. RunTx never retries it.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || isDSNError(err) {
		return false
	}
	var begin *beginError
	connectFailed := errors.As(err, &begin)
	n, ok := errNumber(err)
	switch {
	case ok && connectFailed:
		return n != errAccessDenied && n != errDBAccessDenied && n != errBadDB
	case ok:
		switch n {
		case errLockDeadlock, errLockWaitTimeout, errTooManyConns, errServerShutdown, errQueryInterrupted, errUnknownCommand:
			return true
		}
		return false
	case connectFailed:
		return true
	}
	return sqltx.BrokenConn(err)
}

// beginError is an error of BeginTx on a *sql.DB: database/sql connects
// there, and no statement of the transaction has run. Its message is the
// driver's.
type beginError struct{ err error }

func (e *beginError) Error() string { return e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }
