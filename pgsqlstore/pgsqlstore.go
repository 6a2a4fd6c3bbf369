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
// The package imports no driver: the application opens its *sql.DB with
// the one it uses. It runs pgstore's code, with the same semantics, on the
// *sql.Tx: use pgstore when the application's transactions are pgx.Tx,
// pgsqlstore when they are *sql.Tx. database/sql sends one statement per
// round trip where pgx sends a batch: an admitted call on an unsharded
// limit is one round trip in both, a sharded or LimitAll call more here.
// With lib/pq, add binary_parameters=yes to the DSN (one round trip per
// statement, not two); behind PgBouncer in transaction mode, pgx's driver
// needs default_query_exec_mode=exec or simple_protocol (its default fails
// with SQLSTATE 42P05 or 26000, and the store's error says so).
// docs/postgres.md has the details.
//
// Database errors keep the driver's error (*pq.Error, *pgconn.PgError) for
// errors.As. A missing or outdated txlimit table matches
// txlimit.ErrNotMigrated; a *sql.DB that is not PostgreSQL is an error
// naming the store to use (ErrWrongDatabase).
package pgsqlstore

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/internal/sqltx"
)

// Store is txlimit's store for PostgreSQL on database/sql: give it to
// txlimit.New.
type Store struct{ handle }

// handle makes Store a driver.Store.
type handle = driver.Handle[*sql.Tx]

// backend is the store's operations.
type backend struct {
	sqltx.Store
	pgproto.Ops[*sql.Tx]
}

var _ driver.Ops[*sql.Tx] = (*backend)(nil)

// New returns a store on db, a PostgreSQL database opened with any
// database/sql driver. db may be nil when only the …Tx forms of the limiter
// are used; the other forms then return an *txlimit.InvalidError.
func New(db *sql.DB, opts ...Option) *Store {
	s := &backend{}
	s.AsDB = func(tx *sql.Tx) pgproto.DB { return sqlTx{tx} }
	s.Err = func(ctx context.Context, tx *sql.Tx, err error) error { return s.mapErr(ctx, tx, err) }
	s.Store = sqltx.Store{DB: db, TakeAllFn: s.TakeAll, BeginErr: beginErr, Refused: committedNot,
		CommitErr: func(ctx context.Context, err error) error { return s.mapErr(ctx, nil, err) }}
	for _, o := range opts {
		o(s)
	}
	return &Store{driver.NewHandle[*sql.Tx](s)}
}

// Option configures a Store.
type Option func(*backend)

// SingleKeyStatements is pgstore.SingleKeyStatements, for a txlimit table
// distributed by key (Citus). On database/sql each statement is a round
// trip, so LimitAll then costs two per key (and one per write) instead of
// two: leave the option off on a table not distributed by key.
func SingleKeyStatements() Option {
	return func(s *backend) { s.Proto.SingleKey = true }
}

// beginErr is the error of BeginTx, which Retryable knows: nothing ran.
func beginErr(_ context.Context, err error) error { return &beginError{err} }

// committedNot reports whether a COMMIT that failed with err surely did not
// commit: the server answered, the driver sent nothing (ErrBadConn), or the
// transaction had ended.
func committedNot(err error) bool {
	_, answered := pgproto.SQLState(err)
	return answered || errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, sql.ErrTxDone)
}

// Ping implements driver.Ops; it checks that db is PostgreSQL too.
func (s *backend) Ping(ctx context.Context) error {
	if s.DB == nil {
		return driver.ErrNoPool
	}
	if err := s.DB.PingContext(ctx); err != nil {
		return err
	}
	// The table alone proves nothing: SQLite and MySQL may have it.
	var now time.Time
	if err := s.DB.QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return s.mapErr(ctx, s.DB, err)
	}
	if err := pgproto.Ping(ctx, sqlTx{s.DB}); err != nil {
		return s.mapErr(ctx, s.DB, err)
	}
	return nil
}

func (s *backend) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		res, err = s.Proto.Prune(ctx, sqlTx{tx}, p)
		return s.mapErr(ctx, tx, err)
	})
	return res, err
}

// mapErr adds to err what the user must do about it (pgproto.MapErr). q,
// when not nil, is where a failed statement ran, asked which database it is
// when the error has no SQLSTATE (sqltx.WrongDatabase).
func (s *backend) mapErr(ctx context.Context, q querier, err error) error {
	if _, ok := pgproto.SQLState(err); !ok && err != nil {
		if wrong := sqltx.WrongDatabase(ctx, q, err, ErrWrongDatabase, sqltx.PostgreSQL); wrong != nil {
			return wrong
		}
	}
	return pgproto.MapErr(err, "pgsqlstore", " or with statements prepared by db.Prepare; with pgx's driver add "+
		"default_query_exec_mode=exec (or simple_protocol) to the DSN")
}

// ErrWrongDatabase matches (errors.Is) the error of a call on a *sql.DB or
// *sql.Tx that is not PostgreSQL. Its message names the database found and
// the store to use instead.
var ErrWrongDatabase = errors.New("txlimit/pgsqlstore: the database is not PostgreSQL")
