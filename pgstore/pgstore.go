// Package pgstore is the PostgreSQL store of txlimit, on pgx v5.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
//
// The limiter's TTx is then pgx.Tx, and LimitTx takes the transaction the
// application already has open. Rows are locked and written in that
// transaction, so they stay locked until it ends. An admitted call on an
// unsharded token bucket or fixed window is one statement, INSERT … ON
// CONFLICT DO UPDATE … WHERE <fits> RETURNING, that creates or locks the row,
// refills it to the server's clock, decides and writes with the SQL functions
// of the migrations (algo's arithmetic; a differential test holds them to
// it); other calls lock the rows with SELECT … FOR UPDATE and decide in Go. A
// sharded limit takes the first shard no other transaction holds (FOR UPDATE
// SKIP LOCKED, inside a savepoint the same call ends). PostgreSQL 14 or
// later. The code is shared with pgsqlstore (internal/pgproto), and the
// store keeps no session state.
//
// A limit with Config.Escrow (docs/escrow.md) takes a claim row in the
// caller's transaction and debits in a short transaction of the store's own
// on pool, so the limit's row is locked for one statement only; it needs the
// pool, with connections to spare beyond those the callers hold.
//
// Behind PgBouncer in transaction mode, pgx's default exec mode fails on a
// share of the calls with SQLSTATE 42P05 or 26000 (the store's error says
// so): set pgx.ConnConfig.DefaultQueryExecMode to QueryExecModeExec or
// QueryExecModeSimpleProtocol for such pools (docs/scale-out.md). Database
// errors keep the *pgconn.PgError (errors.As reaches it); a missing or
// outdated table matches txlimit.ErrNotMigrated; Retryable classifies what
// may be run again.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgdb"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// Store is txlimit's store for pgx.
type Store struct {
	pool  *pgxpool.Pool
	proto pgproto.Protocol
	// escrowTx is set once the pool's transactions turn out not to be READ
	// COMMITTED (EscrowRead tells): the lean escrow debits are then sent
	// inside a transaction that sets it, rather than alone.
	escrowTx atomic.Bool
	// settleEvery is how often, at most, escrow calls start a settlement
	// in the background (EscrowSettleEvery); 0 never.
	settleEvery time.Duration
	settling    atomic.Bool  // a background settlement is running
	lastSettle  atomic.Int64 // when the last one started, in Unix ns
}

var _ driver.Store[pgx.Tx] = (*Store)(nil)

// New returns a store on pool. pool may be nil when only the …Tx forms of
// the limiter are used; the other forms then return txlimit.ErrNoPool.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &Store{pool: pool, settleEvery: DefaultEscrowSettleEvery}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Option configures a Store.
type Option func(*Store)

// DefaultEscrowSettleEvery is how often, at most, a store settles escrow
// calls in the background by default (EscrowSettleEvery).
const DefaultEscrowSettleEvery = time.Second

// EscrowSettleEvery sets how often, at most, the store settles escrow calls
// (txlimit.Config.Escrow) in the background: an escrow call made at least d
// after the last background settlement started, while none is running,
// starts one in a goroutine of its own, which settles what Limiter.Settle
// with default options would (every key, up to driver.DefaultSettleMax
// calls) on the store's pool and ends; its errors are dropped (a later one,
// or Limiter.Settle, settles what it left). So while escrow calls are made,
// a rolled-back call's tokens come back within about d, and the escrow
// tables hold about d's worth of calls, without a job of the application's.
// The calls of the last d before the traffic stops wait for the next call
// or for Limiter.Settle: run it every few seconds too if keys go quiet. The
// default is DefaultEscrowSettleEvery; 0 (or less) turns background
// settlement off.
func EscrowSettleEvery(d time.Duration) Option {
	return func(s *Store) { s.settleEvery = max(d, 0) }
}

// SingleKeyStatements makes every statement that locks or writes rows touch
// the rows of one (name, key), for a txlimit table distributed by key (Citus:
// create_distributed_table('txlimit', 'key'); docs/scale-out.md), where a
// statement over the rows of several keys spans several shards. LimitAll
// and Prune then send one statement per key, in the order they lock rows in
// anyway, where by default they send one statement over arrays of keys; the
// other operations are single-key statements either way. pgx batches the
// statements, so LimitAll still costs two round trips, but the server runs
// more statements: leave the option off on a table that is not distributed
// by key. Prune's scan for the next keys reads across keys without locking
// anything, in either mode.
func SingleKeyStatements() Option {
	return func(s *Store) { s.proto.SingleKey = true }
}

// InTx implements driver.Store.
func (s *Store) InTx(ctx context.Context, readOnly bool, fn func(tx pgx.Tx) error) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	opts := pgx.TxOptions{}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	return mapErr(pgx.BeginTxFunc(ctx, s.pool, opts, fn))
}

// Ping implements driver.Store.
func (s *Store) Ping(ctx context.Context, p driver.PingParams) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	err := pgproto.Ping(ctx, s.pool)
	if err == nil && p.Escrow {
		err = queries.ProbeEscrow(ctx, s.pool)
	}
	return mapErr(err)
}

// mapErr adds to err what the user must do about it, keeping err itself
// reachable with errors.As.
func mapErr(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case pgproto.UndefinedTable, pgproto.UndefinedColumn:
		return fmt.Errorf("%w: %w", driver.ErrNotMigrated, err)
	case pgproto.DuplicatePreparedStatement, pgproto.InvalidSQLStatementName:
		return fmt.Errorf("txlimit/pgstore: a prepared statement was lost between transactions, "+
			"as happens behind PgBouncer in transaction mode with pgx's default exec mode; set "+
			"DefaultQueryExecMode to pgx.QueryExecModeExec or QueryExecModeSimpleProtocol on the pool's config: %w", err)
	}
	return err
}

// Take implements driver.Store with the PostgreSQL protocol of
// internal/pgproto, which pgsqlstore shares. A sharded limit is first served
// from the first shard no other transaction holds; when that shard lacks the
// tokens, a denial the committed state already decides is answered without
// a lock; otherwise every shard is locked, in shard order. An escrow take
// is escrowTake's.
func (s *Store) Take(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (res driver.TakeResult, err error) {
	if p.Escrow {
		res, _, err = s.escrowTake(ctx, tx, p)
	} else {
		res, err = s.proto.Take(ctx, tx, p)
	}
	return res, mapErr(err)
}

// TakeAll implements driver.Store: the insert that takes the locks in the
// canonical order and the read of the locked rows go to the server in one
// round trip, and the writes (or, for a denial, the removal of the rows the
// insert created) in one more. Escrow takes come first, each escrowTake's,
// before any row is locked in tx (their debits, on other connections, never
// wait for tx); when a limit denies, the escrow calls already granted are
// unclaimed (their tokens come back at settlement: late, never early), and
// the limits not taken get what Check would say.
func (s *Store) TakeAll(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	res, err := s.takeAll(ctx, tx, p)
	return res, mapErr(err)
}

func (s *Store) takeAll(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	var escrow, locked []int
	for i, t := range p.Takes {
		if t.Escrow {
			escrow = append(escrow, i)
		} else {
			locked = append(locked, i)
		}
	}
	if len(escrow) == 0 {
		return s.proto.TakeAll(ctx, tx, p)
	}
	out := driver.TakeAllResult{OK: true, Results: make([]driver.TakeResult, len(p.Takes))}
	done := make([]bool, len(p.Takes))
	var claims []int64
	for _, i := range escrow {
		t, claim, err := s.escrowTake(ctx, tx, p.Takes[i])
		if err != nil {
			return driver.TakeAllResult{}, err
		}
		out.Results[i], done[i], out.At = t, true, t.At
		out.LockWait += t.LockWait
		if !t.Decision.OK {
			out.OK = false
			break
		}
		claims = append(claims, claim)
	}
	if out.OK && len(locked) > 0 {
		sub := driver.TakeAllParams{Takes: make([]driver.TakeParams, len(locked)), Now: p.Now, TimeLocks: p.TimeLocks}
		for j, i := range locked {
			sub.Takes[j] = p.Takes[i]
		}
		all, err := s.proto.TakeAll(ctx, tx, sub)
		if err != nil {
			return driver.TakeAllResult{}, err
		}
		out.OK, out.At = all.OK, all.At
		out.LockWait += all.LockWait
		for j, i := range locked {
			out.Results[i], done[i] = all.Results[j], true
		}
	}
	if out.OK {
		return out, nil
	}
	for _, claim := range claims {
		if err := s.unclaim(ctx, tx, claim); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	for i, t := range p.Takes {
		if done[i] {
			continue
		}
		read, err := s.proto.Read(ctx, tx, driver.ReadParams{Name: t.Name, Key: t.Key, Now: p.Now})
		if err != nil {
			return driver.TakeAllResult{}, err
		}
		out.Results[i] = driver.Check(t, read)
	}
	return out, nil
}

// Read implements driver.Store.
func (s *Store) Read(ctx context.Context, tx pgx.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	res, err := s.proto.Read(ctx, tx, p)
	return res, mapErr(err)
}

// Credit implements driver.Store. A key with no row is full: there is
// nothing to give back to it.
func (s *Store) Credit(ctx context.Context, tx pgx.Tx, p driver.CreditParams) error {
	return mapErr(s.proto.Credit(ctx, tx, p))
}

// Reset implements driver.Store.
func (s *Store) Reset(ctx context.Context, tx pgx.Tx, p driver.ResetParams) error {
	err := s.proto.Reset(ctx, tx, p)
	if err == nil && p.Escrow {
		err = queries.EscrowDeleteKey(ctx, tx, pgdb.EscrowDeleteKeyParams{Name: p.Name, Key: p.Key})
	}
	return mapErr(err)
}

// Prune implements driver.Store. The rows are locked with FOR UPDATE SKIP
// LOCKED, so a batch never waits for a row that live traffic holds: a key
// with a row held elsewhere is left for a later run.
func (s *Store) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx pgx.Tx) (err error) {
		res, err = s.proto.Prune(ctx, tx, p)
		return err
	})
	return res, mapErr(err)
}

// queries runs the generated statements of escrow mode.
var queries = pgdb.New()

// ClockRange implements driver.ClockRanger: the instants PostgreSQL's
// timestamptz holds.
func (s *Store) ClockRange() (first, last time.Time) { return pgproto.ClockRange() }
