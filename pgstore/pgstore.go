// Package pgstore is the PostgreSQL store of txlimit, on pgx v5.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
//
// The limiter's TTx is then pgx.Tx, and LimitTx takes the transaction the
// application already has open. Rows are read with SELECT … FOR UPDATE and
// written in that transaction, so they stay locked until it ends.
//
// The store keeps no session state and prepares nothing it relies on, so it
// works through PgBouncer in transaction mode and with every pgx query exec
// mode, the simple protocol included. Database errors are returned as pgx
// returns them (a *pgconn.PgError carries the SQLSTATE): under REPEATABLE
// READ or SERIALIZABLE, a concurrent update of the same limit surfaces as a
// serialization failure (40001), which is retryable: roll back and run the
// whole transaction again.
package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore/internal/db"
)

// Store implements txlimit.Store for pgx.
type Store struct {
	pool    *pgxpool.Pool
	queries *db.Queries
}

var _ txlimit.Store[pgx.Tx] = (*Store)(nil)

// New returns a store on pool. pool may be nil when only the …Tx forms of
// the limiter are used; the other forms then return txlimit.ErrNoPool.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, queries: db.New()}
}

// InTx implements txlimit.Store.
func (s *Store) InTx(ctx context.Context, readOnly bool, fn func(tx pgx.Tx) error) error {
	if s.pool == nil {
		return txlimit.ErrNoPool
	}
	opts := pgx.TxOptions{}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	return pgx.BeginTxFunc(ctx, s.pool, opts, fn)
}

// SkipsLocked implements txlimit.Store: PostgreSQL has FOR UPDATE SKIP
// LOCKED.
func (s *Store) SkipsLocked() bool { return true }

// LockShards implements txlimit.Store.
func (s *Store) LockShards(ctx context.Context, tx pgx.Tx, p txlimit.KeyParams) ([]txlimit.ShardRow, time.Time, error) {
	rows, err := s.queries.LockShards(ctx, tx, db.LockShardsParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil || len(rows) == 0 {
		return nil, time.Time{}, err
	}
	out := make([]txlimit.ShardRow, len(rows))
	for i, r := range rows {
		out[i] = txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts}
	}
	return out, rows[0].Clock, nil
}

// InsertShards implements txlimit.Store.
func (s *Store) InsertShards(ctx context.Context, tx pgx.Tx, p txlimit.InsertParams) error {
	return s.queries.InsertShards(ctx, tx, db.InsertShardsParams{
		Name: p.Name, Key: p.Key, Shards: p.Shards, Value: p.Value, Ts: p.TS,
	})
}

const (
	savepoint        = "SAVEPOINT txlimit_try"
	releaseSavepoint = "RELEASE SAVEPOINT txlimit_try"
)

// TryLockShard implements txlimit.Store. The savepoint and the query go to
// the server in one round trip.
func (s *Store) TryLockShard(ctx context.Context, tx pgx.Tx, p txlimit.TryLockParams) (txlimit.ShardRow, time.Time, bool, error) {
	b := &pgx.Batch{}
	b.Queue(savepoint)
	b.Queue(db.TryLockShard, p.Now, p.Name, p.Key, p.Order) // as db.Queries.TryLockShard
	res := tx.SendBatch(ctx, b)
	var r db.TryLockShardRow
	_, err := res.Exec()
	if err == nil {
		err = res.QueryRow().Scan(&r.Shard, &r.Value, &r.Ts, &r.Clock)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == pgx.ErrNoRows:
		return txlimit.ShardRow{}, time.Time{}, false, nil
	case err != nil:
		return txlimit.ShardRow{}, time.Time{}, false, err
	}
	return txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts}, r.Clock, true, nil
}

// KeepTry implements txlimit.Store: the write and the release of the
// savepoint go to the server in one round trip.
func (s *Store) KeepTry(ctx context.Context, tx pgx.Tx, rows []txlimit.ShardWrite) error {
	b := &pgx.Batch{}
	w := writeParams(rows)
	b.Queue(db.WriteShards, w.Names, w.Keys, w.Shards, w.Vals, w.Tss) // as db.Queries.WriteShards

	b.Queue(releaseSavepoint)
	return tx.SendBatch(ctx, b).Close()
}

// UndoTry implements txlimit.Store.
func (s *Store) UndoTry(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT txlimit_try")
	b.Queue(releaseSavepoint)
	return tx.SendBatch(ctx, b).Close()
}

// ReadShards implements txlimit.Store.
func (s *Store) ReadShards(ctx context.Context, tx pgx.Tx, p txlimit.KeyParams) ([]txlimit.ShardRow, time.Time, error) {
	rows, err := s.queries.ReadShards(ctx, tx, db.ReadShardsParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return nil, time.Time{}, err
	}
	var out []txlimit.ShardRow
	for _, r := range rows {
		if r.Shard != nil {
			out = append(out, txlimit.ShardRow{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
		}
	}
	return out, rows[0].Clock, nil
}

// WriteShards implements txlimit.Store.
func (s *Store) WriteShards(ctx context.Context, tx pgx.Tx, rows []txlimit.ShardWrite) error {
	return s.queries.WriteShards(ctx, tx, writeParams(rows))
}

func writeParams(rows []txlimit.ShardWrite) db.WriteShardsParams {
	p := db.WriteShardsParams{
		Names:  make([]string, len(rows)),
		Keys:   make([]string, len(rows)),
		Shards: make([]int32, len(rows)),
		Vals:   make([]float64, len(rows)),
		Tss:    make([]time.Time, len(rows)),
	}
	for i, r := range rows {
		p.Names[i], p.Keys[i], p.Shards[i], p.Vals[i], p.Tss[i] = r.Name, r.Key, r.Shard, r.Value, r.TS
	}
	return p
}

// DeleteKey implements txlimit.Store.
func (s *Store) DeleteKey(ctx context.Context, tx pgx.Tx, name, key string) error {
	return s.queries.DeleteKey(ctx, tx, db.DeleteKeyParams{Name: name, Key: key})
}
