// Package sqltx is what the stores on database/sql share: their InTx,
// Commit and InTxCommit, their RunTx, and the error that names the database
// a store was given when it is another.
package sqltx

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/retrytx"
)

// Store is the InTx, Commit and InTxCommit of a store on database/sql.
// BeginErr and CommitErr turn the errors of BeginTx and COMMIT into the
// store's; Refused reports whether a failed COMMIT surely did not commit.
type Store struct {
	DB                  *sql.DB
	TakeAllFn           TakeAll
	BeginErr, CommitErr func(ctx context.Context, err error) error
	Refused             func(err error) bool
}

// InTx is driver.Ops.InTx. A transaction that writes is begun with no
// options, so that the DSN's settings decide (SQLite's _txlock, say).
func (s Store) InTx(ctx context.Context, readOnly bool, fn func(tx *sql.Tx) error) error {
	return s.run(ctx, readOnly, fn, func(tx *sql.Tx) error { return s.CommitErr(ctx, tx.Commit()) })
}

// run begins a transaction, runs fn and then end in it, rolling back when
// fn fails or panics.
func (s Store) run(ctx context.Context, readOnly bool, fn, end func(tx *sql.Tx) error) error {
	if s.DB == nil {
		return driver.ErrNoPool
	}
	var opts *sql.TxOptions
	if readOnly {
		opts = &sql.TxOptions{ReadOnly: true}
	}
	tx, err := s.DB.BeginTx(ctx, opts)
	if err != nil {
		return s.BeginErr(ctx, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	done = true
	return end(tx)
}

// Commit takes p in tx, then sends COMMIT when it granted and ROLLBACK
// otherwise: database/sql sends one statement at a time.
func (s Store) Commit(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	res := driver.TakeAllResult{OK: true}
	var err error
	if len(p.Takes) > 0 {
		res, err = s.TakeAllFn(ctx, tx, p)
	}
	if err != nil || !res.OK {
		_ = tx.Rollback()
		return res, err
	}
	if err := tx.Commit(); err != nil {
		if s.Refused(err) {
			return driver.TakeAllResult{}, s.CommitErr(ctx, err)
		}
		return driver.TakeAllResult{}, fmt.Errorf("%w: %w", driver.ErrCommitUnknown, s.CommitErr(ctx, err))
	}
	return res, nil
}

// InTxCommit runs fn in a transaction InTx would begin, ended by Commit.
func (s Store) InTxCommit(ctx context.Context, fn func(tx *sql.Tx) error, p driver.TakeAllParams) (res driver.TakeAllResult, err error) {
	err = s.run(ctx, false, fn, func(tx *sql.Tx) (err error) {
		res, err = s.Commit(ctx, tx, p)
		return err
	})
	return res, err
}

// TakeAll is a store's driver.Ops.TakeAll.
type TakeAll func(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error)

// RunTx is the RunTx of the database/sql store name (retrytx.Run). begin
// turns the error of BeginTx into the store's; answered reports whether the
// database refused a COMMIT that failed with err: else it is not run again.
func RunTx(ctx context.Context, name string, attempts int, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error,
	retryable func(error) bool, begin func(error) error, answered func(error) bool,
) error {
	return retrytx.Run(ctx, name, attempts, retryable, func() error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return begin(err)
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			if answered(err) {
				return err
			}
			return &retrytx.Ambiguous{Err: fmt.Errorf("%s: COMMIT failed, and the transaction may or may not have committed: %w", name, err)}
		}
		return nil
	})
}

// Querier is where a store's statement ran: a *sql.Tx or a *sql.DB.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Database is a database a store on database/sql runs on.
type Database int

const (
	PostgreSQL Database = iota
	SQLite
	MySQL
)

// databases are each Database's name, the statement that only it answers,
// and the store to use on it.
var databases = [...]struct{ name, probe, use string }{
	PostgreSQL: {"PostgreSQL", "SELECT current_setting('server_version')", "pgsqlstore.New(db) for *sql.Tx, or pgstore.New(pool) for pgx"},
	SQLite:     {"SQLite", "SELECT sqlite_version()", "sqlitestore.New(db)"},
	MySQL:      {"MySQL or MariaDB", "SELECT @@version", "mysqlstore.New(db)"},
}

// WrongDatabase is the error of a store for want whose statement failed with
// cause on q, when q is another database: wrong (the store's
// ErrWrongDatabase), naming the database and the store to use. It asks q
// unless cause tells (a SQLSTATE is PostgreSQL's, whose transaction is then
// aborted), and returns nil when q is want or cannot tell.
func WrongDatabase(ctx context.Context, q Querier, cause, wrong error, want Database) error {
	found, version := Database(-1), ""
	var pgErr interface{ SQLState() string }
	switch {
	case errors.As(cause, &pgErr):
		found, version = PostgreSQL, "(it answered with SQLSTATE "+pgErr.SQLState()+")"
	case q == nil || errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) ||
		errors.Is(cause, sql.ErrTxDone) || errors.Is(cause, sql.ErrConnDone) || BrokenConn(cause):
		return nil
	default:
		for i, db := range []Database{want, PostgreSQL, SQLite, MySQL} {
			if (i == 0 || db != want) && q.QueryRowContext(ctx, databases[db].probe).Scan(&version) == nil {
				found = db
				break
			}
		}
	}
	if found < 0 || found == want {
		return nil
	}
	d := databases[found]
	return driver.Setup(fmt.Errorf("%w: it is %s %s; use %s (the store's statement failed: %w)", wrong, d.name, version, d.use, cause))
}

// BrokenConn reports whether err says that the connection broke: the server
// or the network went away, or the driver gave the connection up.
func BrokenConn(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, sqldriver.ErrBadConn) ||
		// go-sql-driver/mysql's ErrInvalidConn, when the server closed the
		// connection under a statement.
		strings.Contains(err.Error(), "invalid connection")
}

// SQLiteBusy reports whether err is SQLITE_BUSY (another connection held
// the write lock past busy_timeout) from a driver whose errors carry
// SQLite's extended code (modernc.org/sqlite's Error.Code), whose low byte
// is the primary code.
func SQLiteBusy(err error) bool {
	const busy = 5 // SQLITE_BUSY
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == busy
}
