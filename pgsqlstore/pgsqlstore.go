// Package pgsqlstore is the PostgreSQL store of txlimit on database/sql, for
// applications whose transactions are *sql.Tx: lib/pq, pgx's
// database/sql driver (github.com/jackc/pgx/v5/stdlib), and what is built
// on them (sqlx, GORM, bun, ent).
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // or "postgres" with lib/pq
//	…
//	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil { … }
//	limiter, err := txlimit.New(pgsqlstore.New(db), limits, nil)
//
// The limiter's TTx is then *sql.Tx, and LimitTx takes the transaction the
// application already has open. The package imports no driver: the
// application opens its *sql.DB with the one it already uses.
//
// # pgstore or pgsqlstore
//
// Both run the same statements (pgsqlstore's are derived from pgstore's and
// compiled by sqlc for database/sql), with the same semantics: the database
// server's clock, SELECT … FOR UPDATE in the caller's transaction, sharded
// limits served from the first shard no other transaction holds (FOR UPDATE
// SKIP LOCKED inside a savepoint that the same call ends), LimitAll's rows
// locked in one canonical order, a Prune that never waits for a row live
// traffic holds. Use pgstore when the application's transactions are
// pgx.Tx; use pgsqlstore when they are *sql.Tx. database/sql sends one
// statement per round trip where pgx sends a batch, so an admitted call on
// an unsharded limit costs the same one round trip in both (one upsert that
// refills, decides and writes; a denial adds the locking read), while the
// sharded fast path costs four (the savepoint, the
// try-lock, the write, the release) where pgstore needs two, and LimitAll
// one per statement (the insert, the locking read, one write per limit)
// where pgstore needs two. With lib/pq, add binary_parameters=yes to the
// DSN: otherwise it parses each statement with parameters in one round trip
// and executes it in the next.
//
// database/sql's own work on the client (a goroutine per transaction and
// per query, the conversion of every argument and column) makes a call a
// little slower than pgstore's (docs/performance.md).
//
// # Poolers and drivers
//
// The store keeps no session state and relies on no prepared statement
// surviving a transaction. lib/pq runs every statement with parameters as an
// unnamed prepared statement within one round trip, which works behind
// PgBouncer in transaction mode. pgx's driver does too in the exec modes
// that do not cache statements: add default_query_exec_mode=exec (or
// simple_protocol) to the DSN for such a pooler; its default,
// cache_statement, fails there with SQLSTATE 42P05 or 26000, and the store's
// errors for those say so. Do not call db.Prepare for txlimit's statements
// either.
//
// # Errors
//
// Database errors keep the driver's error (*pq.Error, *pgconn.PgError), so
// errors.As reaches it and its SQLSTATE. A missing or outdated txlimit table
// matches txlimit.ErrNotMigrated. Under REPEATABLE READ or SERIALIZABLE, a
// concurrent update of the same limit surfaces as a serialization failure
// (40001); Retryable classifies it and the other errors after which running
// the whole transaction again is safe, a failure to connect included, as
// pgstore.Retryable does (see Retryable for lib/pq's case). A *sql.DB that is not PostgreSQL
// (SQLite, MySQL) is named as such, with the store to use, by Ping and by
// the first call that fails on it.
package pgsqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// Store is txlimit's store for PostgreSQL on database/sql.
type Store struct {
	db    *sql.DB
	proto pgproto.Protocol
}

var _ driver.Store[*sql.Tx] = (*Store)(nil)

// New returns a store on db, a PostgreSQL database opened with any
// database/sql driver. db may be nil when only the …Tx forms of the limiter
// are used; the other forms then return txlimit.ErrNoPool.
func New(db *sql.DB, opts ...Option) *Store {
	s := &Store{db: db}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Option configures a Store.
type Option func(*Store)

// SingleKeyStatements makes every statement that locks or writes rows touch
// the rows of one (name, key), for a txlimit table distributed by key (Citus:
// create_distributed_table('txlimit', 'key'); docs/scale-out.md), where a
// statement over the rows of several keys spans several shards. LimitAll
// and Prune then run one statement per key, in the order they lock rows in
// anyway, where by default they run one statement over arrays of keys; the
// other operations are single-key statements either way. On database/sql
// each statement is a round trip, so LimitAll costs two per key (and one
// per write) instead of two: leave the option off on a table that is not
// distributed by key. Prune's scan for the next keys reads across keys
// without locking anything, in either mode.
func SingleKeyStatements() Option {
	return func(s *Store) { s.proto.SingleKey = true }
}

// InTx implements driver.Store. A transaction that only reads (Check,
// Value) is begun read-only. It is rolled back when fn returns an error or
// panics (the panic then continues) and committed otherwise.
func (s *Store) InTx(ctx context.Context, readOnly bool, fn func(tx *sql.Tx) error) error {
	return sqltx.InTx(ctx, s.db, readOnly, fn,
		func(err error) error { return &beginError{err} }, // Retryable: nothing ran
		func(err error) error { return s.mapErr(ctx, nil, err) })
}

// Ping implements driver.Store: it checks that db is PostgreSQL and that
// the txlimit table is there with every column the library uses.
func (s *Store) Ping(ctx context.Context, _ driver.PingParams) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	if err := s.db.PingContext(ctx); err != nil {
		return err
	}
	// The store reads PostgreSQL's clock_timestamp(): SQLite and MySQL
	// have none, and the table alone (which they may have) proves nothing.
	var now time.Time
	if err := s.db.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return s.mapErr(ctx, s.db, err)
	}
	if err := pgproto.Ping(ctx, sqlTx{s.db}); err != nil {
		return s.mapErr(ctx, s.db, err)
	}
	return nil
}

// Take implements driver.Store (pgproto.Take: the protocol pgstore runs).
func (s *Store) Take(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	res, err := s.proto.Take(ctx, sqlTx{tx}, p)
	return res, s.mapErr(ctx, tx, err)
}

// TakeAll implements driver.Store.
func (s *Store) TakeAll(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	res, err := s.proto.TakeAll(ctx, sqlTx{tx}, p)
	return res, s.mapErr(ctx, tx, err)
}

// Read implements driver.Store.
func (s *Store) Read(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	res, err := s.proto.Read(ctx, sqlTx{tx}, p)
	return res, s.mapErr(ctx, tx, err)
}

// Credit implements driver.Store.
func (s *Store) Credit(ctx context.Context, tx *sql.Tx, p driver.CreditParams) error {
	return s.mapErr(ctx, tx, s.proto.Credit(ctx, sqlTx{tx}, p))
}

// Reset implements driver.Store.
func (s *Store) Reset(ctx context.Context, tx *sql.Tx, p driver.ResetParams) error {
	return s.mapErr(ctx, tx, s.proto.Reset(ctx, sqlTx{tx}, p))
}

// Prune implements driver.Store.
func (s *Store) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		res, err = s.proto.Prune(ctx, sqlTx{tx}, p)
		return s.mapErr(ctx, tx, err)
	})
	return res, err
}

// mapErr adds to err what the user must do about it, keeping err itself
// reachable with errors.As. q, when not nil, is where a failed statement
// ran: an error that is not PostgreSQL's is checked there for a database
// that is not PostgreSQL.
func (s *Store) mapErr(ctx context.Context, q querier, err error) error {
	if err == nil {
		return nil
	}
	code, ok := pgproto.SQLState(err)
	if !ok {
		if q != nil {
			if wrong := wrongDatabase(ctx, q, err); wrong != nil {
				return wrong
			}
		}
		return err
	}
	switch code {
	case pgproto.UndefinedTable, pgproto.UndefinedColumn:
		return fmt.Errorf("%w: %w", driver.ErrNotMigrated, err)
	case pgproto.DuplicatePreparedStatement, pgproto.InvalidSQLStatementName:
		return fmt.Errorf("txlimit/pgsqlstore: a prepared statement was lost between transactions, as happens "+
			"behind PgBouncer in transaction mode with pgx's default exec mode or with statements prepared by "+
			"db.Prepare; with pgx's driver add default_query_exec_mode=exec (or simple_protocol) to the DSN: %w", err)
	}
	return err
}

// ClockRange implements driver.ClockRanger: the instants PostgreSQL's
// timestamptz holds.
func (s *Store) ClockRange() (first, last time.Time) { return pgproto.ClockRange() }
