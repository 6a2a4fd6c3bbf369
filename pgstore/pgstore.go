// Package pgstore is the PostgreSQL store of txlimit, on pgx v5.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
//
// An admitted call on an unsharded token bucket or fixed window is one
// statement (INSERT … ON CONFLICT DO UPDATE … WHERE <fits> RETURNING) that
// refills the row to the server's clock, decides and writes with the
// migrations' SQL functions (algo's arithmetic); other calls lock the rows
// with SELECT … FOR UPDATE and decide in Go. A sharded limit takes the
// first shard no other transaction holds (FOR UPDATE SKIP LOCKED, in a
// savepoint the call ends). PostgreSQL 14 or later; no session state.
//
// Behind PgBouncer in transaction mode, pgx's default exec mode fails on a
// share of the calls with SQLSTATE 42P05 or 26000 (the store's error says
// so): set pgx.ConnConfig.DefaultQueryExecMode to QueryExecModeExec or
// QueryExecModeSimpleProtocol for such pools (docs/scale-out.md). Database
// errors keep the *pgconn.PgError for errors.As; a missing or outdated
// table matches txlimit.ErrNotMigrated.
package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// Store is txlimit's store for pgx: give it to txlimit.New.
type Store struct{ handle }

// handle makes Store a driver.Store.
type handle = driver.Handle[pgx.Tx]

// backend is the store's operations.
type backend struct {
	pgproto.Ops[pgx.Tx]
	pool *pgxpool.Pool
}

var _ driver.Ops[pgx.Tx] = (*backend)(nil)

// New returns a store on pool. pool may be nil when only the …Tx forms of
// the limiter are used; the other forms then return an *txlimit.InvalidError.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &backend{pool: pool}
	s.AsDB = func(tx pgx.Tx) pgproto.DB { return tx }
	s.Err = func(_ context.Context, _ pgx.Tx, err error) error { return mapErr(err) }
	for _, o := range opts {
		o(s)
	}
	return &Store{driver.NewHandle[pgx.Tx](s)}
}

// Option configures a Store.
type Option func(*backend)

// SingleKeyStatements makes every statement that locks or writes rows touch
// the rows of one (name, key), for a txlimit table distributed by key (Citus:
// create_distributed_table('txlimit', 'key'); docs/scale-out.md). LimitAll
// and Prune then send one statement per key, in their locking order, rather
// than one over arrays of keys; pgx batches them, so LimitAll still costs
// two round trips, but the server runs more statements: leave the option
// off on a table not distributed by key. Prune's scan for the next keys
// reads across keys, locking nothing, in either mode.
func SingleKeyStatements() Option {
	return func(s *backend) { s.Proto.SingleKey = true }
}

func (s *backend) InTx(ctx context.Context, readOnly bool, fn func(tx pgx.Tx) error) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	opts := pgx.TxOptions{}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	return mapErr(pgx.BeginTxFunc(ctx, s.pool, opts, fn))
}

func (s *backend) Ping(ctx context.Context) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	return mapErr(pgproto.Ping(ctx, s.pool))
}

// mapErr adds to err what the user must do about it (pgproto.MapErr).
func mapErr(err error) error {
	return pgproto.MapErr(err, "pgstore",
		"; set DefaultQueryExecMode to pgx.QueryExecModeExec or QueryExecModeSimpleProtocol on the pool's config")
}

func (s *backend) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx pgx.Tx) (err error) {
		res, err = s.Proto.Prune(ctx, tx, p)
		return err
	})
	return res, mapErr(err)
}
