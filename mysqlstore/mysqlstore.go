// Package mysqlstore is the MySQL and MariaDB store of txlimit on
// database/sql, for applications whose transactions are *sql.Tx: the
// go-sql-driver/mysql driver and what is built on it (sqlx, GORM, bun,
// ent). It needs MySQL 8.0.19 or later or MariaDB 10.6 or later, with InnoDB.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app?parseTime=true&interpolateParams=true")
//	…
//	if err := migrations.Up(ctx, db, migrations.MySQL); err != nil { … }
//	limiter, err := txlimit.New(mysqlstore.New(db), limits, nil)
//	…
//	if err := limiter.Ping(ctx); err != nil { … } // names any DSN setting to fix
//
// The limiter's TTx is then *sql.Tx, and LimitTx takes the transaction the
// application already has open. The package imports no driver: the
// application opens its *sql.DB with the one it uses. docs/mysql.md says
// more on each section below.
//
// # The DSN
//
// Limiter.Ping checks each of these by what the driver does, and its error
// names the parameter to set:
//
//   - parseTime=true (required): the store reads DATETIME(6) columns as
//     time.Time; without it the driver returns bytes.
//   - loc unset, or loc=UTC (required): the store keeps every time in UTC
//     (UTC_TIMESTAMP(6)); with another loc the driver would read and write
//     those times in that zone, off by its offset.
//   - interpolateParams=true (required by Ping): without it the driver
//     prepares each statement that has arguments on the server and runs it
//     in a second round trip. Results are bit for bit the same either way:
//     the store reads every float64 argument through CAST(… AS DOUBLE),
//     never as the DECIMAL literal the driver writes.
//   - clientFoundRows unset or false (required by Ping): on MySQL the store
//     reads the affected-rows count of its one-statement take to tell a
//     grant from a denial; with clientFoundRows a row left as it was counts
//     as affected, and each such call costs a round trip more (it still
//     decides right).
//   - multiStatements: not used (one statement per query); leaving it off
//     keeps a SQL injection elsewhere in the application from running
//     statements of its own.
//
// The transaction isolation level can be REPEATABLE READ (InnoDB's
// default) or READ COMMITTED. Under SERIALIZABLE, InnoDB turns the store's
// plain reads into shared locks, and calls on a hot limit then deadlock
// (1213, retryable) instead of queueing.
//
// # Clock
//
// Every call reads one clock: txlimit.Options.Clock, or the server's
// UTC_TIMESTAMP(6) (microseconds, UTC whatever the session's time_zone,
// replicated as the source read it), the time the statement that holds the
// row started. A call that waited for a row lock then reads a clock from
// before the other transaction's write; algo treats a clock behind a row's
// time as one that stepped back (no token added, the row's time never
// moved back), so the call never admits more than it should and gets that
// interval's refill later. SYSDATE(6), read when evaluated, is in the
// session's time_zone (which steps back an hour when daylight saving time
// ends), differs from row to row within one statement, and is replicated
// wrongly under statement-based binary logging.
//
// # Locking
//
// Under REPEATABLE READ, InnoDB locks the gap where a row it looks for is
// missing, or after a range it scans; gap locks block inserts, so two
// transactions that each look for a new key in the same gap and then insert
// it deadlock (the bug Bucket4j and gravitee hit on the first use of new
// keys). The store never looks for a row that may be missing with a locking
// read: it creates or locks rows with INSERT … ON DUPLICATE KEY UPDATE
// (which locks the row it finds by its primary key, and no gap) and then
// locks them by their whole primary key. Reset (a range DELETE) is the
// exception: it also locks the gap after the key's rows until the
// transaction ends.
//
// An admitted call on an unsharded limit is one INSERT … ON DUPLICATE KEY
// UPDATE that creates or locks the row, refills, decides and writes (on
// MySQL a second statement reads what it did; on MariaDB, RETURNING); a
// denial then locks every row of the key and decides in Go. A sharded limit
// is read first, locking nothing, and a denial that state decides is
// answered at once; otherwise one shard that holds twice the count and no
// other transaction holds is locked (SKIP LOCKED) and taken from. InnoDB
// keeps that lock until the transaction ends, savepoint or not, so a shard
// that turns out to lack the tokens is decided with the other free shards,
// never waiting for another. LimitAll creates and locks the rows of every
// limit in the canonical order (name, then key, compared as bytes: the
// columns are VARBINARY), so that two callers never deadlock on them. Prune
// locks with SKIP LOCKED by primary key and never waits for a row live
// traffic holds.
//
// # Errors
//
// Database errors keep the driver's error (*mysql.MySQLError), so
// errors.As reaches it and its number. A missing or outdated txlimit table
// matches txlimit.ErrNotMigrated; a DSN setting the store needs, ErrDSN; a
// database that is not MySQL, ErrWrongDatabase (txlimit.Options.FailOpen
// grants on neither: no retry cures them). Retryable tells the errors after
// which running the whole transaction again is safe (a deadlock, a lock
// wait timeout, a Galera conflict, a lost connection), and RunTx runs it
// again. After any error, roll the transaction back: part of what the call
// meant to write may be in it.
package mysqlstore

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"sync/atomic"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/sqltx"
	gen "github.com/txlimit/txlimit/mysqlstore/internal/db"
)

// Store is txlimit's store for MySQL and MariaDB: give it to txlimit.New.
type Store struct{ handle }

// handle makes Store a driver.Store.
type handle = driver.Handle[*sql.Tx]

// backend is the store's operations, and the engine's dialect for InnoDB:
// row locks and SKIP LOCKED (engine.SkipLocker), but a row lock held until
// the transaction ends, savepoint or not (engine.FreeLocker).
type backend struct {
	sqltx.Store
	db *sql.DB
	// maria is whether the server is MariaDB, whose INSERT … RETURNING
	// saves TakeRow its second round trip: nil until TakeRow first asked.
	maria atomic.Pointer[bool]
}

var (
	_ driver.Ops[*sql.Tx]        = (*backend)(nil)
	_ driver.ClockRanger         = (*backend)(nil)
	_ engine.FreeLocker[*sql.Tx] = (*backend)(nil)
	_ engine.Dialect[*sql.Tx]    = (*backend)(nil)
)

// New returns a store on db, a MySQL or MariaDB database opened with
// go-sql-driver/mysql (or any driver that behaves as the package
// documentation describes). db may be nil when only the …Tx forms of the
// limiter are used; the other forms then return an *txlimit.InvalidError.
func New(db *sql.DB) *Store {
	s := &backend{db: db}
	s.Store = sqltx.Store{DB: db, TakeAllFn: s.TakeAll, Refused: committedNot,
		BeginErr:  func(_ context.Context, err error) error { return &beginError{err} }, // Retryable: nothing ran
		CommitErr: func(ctx context.Context, err error) error { return wrap(ctx, nil, "commit", err) }}
	return &Store{driver.NewHandle[*sql.Tx](s)}
}

// committedNot reports whether a COMMIT that failed with err surely did not
// commit: the server answered (a MySQL error number, as Galera's
// certification failure 1213 at COMMIT), the driver knew the connection
// broken before it sent anything (driver.ErrBadConn), or the transaction had
// already ended.
func committedNot(err error) bool {
	_, answered := errNumber(err)
	return answered || errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, sql.ErrTxDone)
}

func (s *backend) Ping(ctx context.Context) error { return ping(ctx, s.db) }

// ClockRange is the years 1000 to 9999 that DATETIME(6) holds (MySQL stores
// others, or a zero date under a lax sql_mode, without saying so).
func (s *backend) ClockRange() (first, last time.Time) { return minTime, maxTime }

func (s *backend) Take(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	return engine.Take(ctx, s, tx, p)
}

func (s *backend) TakeAll(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return engine.TakeAll(ctx, s, tx, p)
}

func (s *backend) Credit(ctx context.Context, tx *sql.Tx, p driver.CreditParams) error {
	return engine.Credit(ctx, s, tx, p)
}

func (s *backend) Reset(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	return wrap(ctx, tx, "delete the limit's rows", queries.DeleteKey(ctx, tx, gen.DeleteKeyParams{Name: []byte(k.Name), Key: []byte(k.Key)}))
}

func (s *backend) Pause(ctx context.Context, tx *sql.Tx, p driver.PauseParams) error {
	return engine.Pause(ctx, s, tx, p)
}

func (s *backend) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		res, err = engine.Prune(ctx, s, tx, p)
		return err
	})
	return res, err
}
