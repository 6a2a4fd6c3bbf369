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
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	savepoint         = "SAVEPOINT txlimit_try"
	releaseSavepoint  = "RELEASE SAVEPOINT txlimit_try"
	rollbackSavepoint = "ROLLBACK TO SAVEPOINT txlimit_try"
)

// TryLockShard implements txlimit.Store. The savepoint and the lock (with
// the read of every row, when p.ReadAll, in the same statement) go to the
// server in one round trip.
func (s *Store) TryLockShard(ctx context.Context, tx pgx.Tx, p txlimit.TryLockParams) (txlimit.TryLockResult, error) {
	b := &pgx.Batch{}
	b.Queue(savepoint)
	if p.ReadAll {
		b.Queue(db.TryLockShardAndRead, p.Now, p.Name, p.Key, p.Start) // as db.Queries.TryLockShardAndRead
	} else {
		b.Queue(db.TryLockShard, p.Now, p.Name, p.Key, p.Start) // as db.Queries.TryLockShard
	}
	res := tx.SendBatch(ctx, b)
	var out txlimit.TryLockResult
	_, err := res.Exec()
	switch {
	case err != nil:
	case p.ReadAll:
		var rows pgx.Rows
		rows, err = res.Query()
		if err == nil {
			var r db.TryLockShardAndReadRow
			_, err = pgx.ForEachRow(rows, []any{&r.Shard, &r.Value, &r.Ts, &r.Clock, &r.LockedShard, &r.LockedValue, &r.LockedTs}, func() error {
				out.Now = r.Clock
				if r.Shard != nil {
					out.All = append(out.All, txlimit.ShardRow{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
				}
				if r.LockedShard != nil {
					out.Row = txlimit.ShardRow{Shard: *r.LockedShard, Value: *r.LockedValue, TS: *r.LockedTs}
					out.Locked = true
				}
				return nil
			})
		}
	default:
		var r db.TryLockShardRow
		err = res.QueryRow().Scan(&r.Shard, &r.Value, &r.Ts, &r.Clock)
		if err == nil {
			out = txlimit.TryLockResult{Row: txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Now: r.Clock}
		} else if err == pgx.ErrNoRows {
			err = nil
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return txlimit.TryLockResult{}, err
	}
	return out, nil
}

// KeepTry implements txlimit.Store: the write and the release of the
// savepoint go to the server in one round trip.
func (s *Store) KeepTry(ctx context.Context, tx pgx.Tx, rows []txlimit.ShardWrite) error {
	b := &pgx.Batch{}
	if err := s.queueWrites(ctx, b, rows); err != nil {
		return err
	}
	b.Queue(releaseSavepoint)
	return tx.SendBatch(ctx, b).Close()
}

// WaitShard implements txlimit.Store. It runs inside TryLockShard's
// savepoint, so UndoTry gives its lock back too.
func (s *Store) WaitShard(ctx context.Context, tx pgx.Tx, p txlimit.WaitShardParams) (txlimit.TryLockResult, error) {
	r, err := s.queries.WaitShard(ctx, tx, db.WaitShardParams{Name: p.Name, Key: p.Key, Shard: p.Shard, Now: p.Now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return txlimit.TryLockResult{}, nil
	case err != nil:
		return txlimit.TryLockResult{}, err
	}
	return txlimit.TryLockResult{Row: txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Now: r.Clock}, nil
}

// UndoTry implements txlimit.Store.
func (s *Store) UndoTry(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	b.Queue(rollbackSavepoint)
	b.Queue(releaseSavepoint)
	return tx.SendBatch(ctx, b).Close()
}

// ReadShards implements txlimit.Store.
func (s *Store) ReadShards(ctx context.Context, tx pgx.Tx, p txlimit.KeyParams) ([]txlimit.ShardRow, time.Time, error) {
	rows, err := tx.Query(ctx, db.ReadShards, p.Now, p.Name, p.Key) // as db.Queries.ReadShards
	if err != nil {
		return nil, time.Time{}, err
	}
	return readRows(rows)
}

// readRows collects the result of db.ReadShards: one row per shard, or a
// single row of NULLs with the clock when the key has none.
func readRows(rows pgx.Rows) ([]txlimit.ShardRow, time.Time, error) {
	var out []txlimit.ShardRow
	var clock time.Time
	var r db.ReadShardsRow
	_, err := pgx.ForEachRow(rows, []any{&r.Shard, &r.Value, &r.Ts, &r.Clock}, func() error {
		clock = r.Clock
		if r.Shard != nil {
			out = append(out, txlimit.ShardRow{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return out, clock, nil
}

// WriteShards implements txlimit.Store: one statement per (name, key), all
// in one round trip.
func (s *Store) WriteShards(ctx context.Context, tx pgx.Tx, rows []txlimit.ShardWrite) error {
	b := &pgx.Batch{}
	if err := s.queueWrites(ctx, b, rows); err != nil {
		return err
	}
	if len(b.QueuedQueries) == 1 { // the usual case: one key
		q := b.QueuedQueries[0]
		_, err := tx.Exec(ctx, q.SQL, q.Arguments...)
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}

// queueWrites queues the statements that store rows: a one-row UPDATE for a
// key written on one shard, one UPDATE per key for several shards.
func (s *Store) queueWrites(ctx context.Context, b *pgx.Batch, rows []txlimit.ShardWrite) error {
	q := queuer{b}
	for len(rows) > 0 {
		n := 1
		for n < len(rows) && rows[n].Name == rows[0].Name && rows[n].Key == rows[0].Key {
			n++
		}
		var err error
		if r := rows[0]; n == 1 {
			err = s.queries.WriteShard(ctx, q, db.WriteShardParams{Name: r.Name, Key: r.Key, Shard: r.Shard, Value: r.Value, Ts: r.TS})
		} else {
			p := db.WriteKeyShardsParams{Name: r.Name, Key: r.Key,
				Shards: make([]int32, n), Vals: make([]float64, n), Tss: make([]time.Time, n)}
			for i, w := range rows[:n] {
				p.Shards[i], p.Vals[i], p.Tss[i] = w.Shard, w.Value, w.TS
			}
			err = s.queries.WriteKeyShards(ctx, q, p)
		}
		if err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// queuer is a db.DBTX that queues the statements of the generated :exec
// methods into a batch instead of sending them, so that batches reuse the
// generated code and its argument order.
type queuer struct{ b *pgx.Batch }

func (q queuer) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

var errQueuerReads = errors.New("pgstore: internal error: a query that returns rows cannot be queued")

func (q queuer) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errQueuerReads
}

func (q queuer) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return errQueuerReads }

// DeleteKey implements txlimit.Store.
func (s *Store) DeleteKey(ctx context.Context, tx pgx.Tx, name, key string) error {
	return s.queries.DeleteKey(ctx, tx, db.DeleteKeyParams{Name: name, Key: key})
}

// LockKeys implements txlimit.Store: the insert that takes the locks in the
// canonical order and the read of the locked rows go to the server in one
// round trip.
func (s *Store) LockKeys(ctx context.Context, tx pgx.Tx, p txlimit.LockKeysParams) (txlimit.LockedKeys, error) {
	n := len(p.Keys)
	ins := db.InsertKeysParams{
		Names: make([]string, n), Keys: make([]string, n), ShardCounts: make([]int32, n),
		Vals: make([]float64, n), Tss: make([]time.Time, n),
	}
	index := make(map[txlimit.KeyRef]int, n)
	for i, k := range p.Keys {
		ins.Names[i], ins.Keys[i], ins.ShardCounts[i], ins.Vals[i], ins.Tss[i] = k.Name, k.Key, k.Shards, k.Value, k.TS
		index[txlimit.KeyRef{Name: k.Name, Key: k.Key}] = i
	}
	b := &pgx.Batch{}
	b.Queue(db.InsertKeys, ins.Names, ins.Keys, ins.ShardCounts, ins.Vals, ins.Tss) // as db.Queries.InsertKeys
	b.Queue(db.LockKeys, p.Now, ins.Names, ins.Keys, ins.ShardCounts)               // as db.Queries.LockKeys
	res := tx.SendBatch(ctx, b)
	out := txlimit.LockedKeys{Rows: make([][]txlimit.ShardRow, n)}
	rows, err := res.Query()
	if err == nil {
		var r db.InsertKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard}, func() error {
			out.Created = append(out.Created, txlimit.ShardKey{Name: r.Name, Key: r.Key, Shard: r.Shard})
			return nil
		})
	}
	if err == nil {
		rows, err = res.Query()
	}
	if err == nil {
		var r db.LockKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard, &r.Value, &r.Ts, &r.Clock}, func() error {
			i := index[txlimit.KeyRef{Name: r.Name, Key: r.Key}]
			out.Rows[i] = append(out.Rows[i], txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts})
			if out.Now.IsZero() {
				out.Now = r.Clock // clock_timestamp() is read per row, after every lock is held
			}
			return nil
		})
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return txlimit.LockedKeys{}, err
	}
	return out, nil
}

// DeleteShards implements txlimit.Store.
func (s *Store) DeleteShards(ctx context.Context, tx pgx.Tx, rows []txlimit.ShardKey) (int, error) {
	p := db.DeleteShardsParams{
		Names: make([]string, len(rows)), Keys: make([]string, len(rows)), Shards: make([]int32, len(rows)),
	}
	for i, r := range rows {
		p.Names[i], p.Keys[i], p.Shards[i] = r.Name, r.Key, r.Shard
	}
	n, err := s.queries.DeleteShards(ctx, tx, p)
	return int(n), err
}

// ScanKeys implements txlimit.Store, in the order of the primary key (the
// database's collation).
func (s *Store) ScanKeys(ctx context.Context, tx pgx.Tx, p txlimit.ScanKeysParams) ([]txlimit.KeyRef, error) {
	rows, err := s.queries.ScanKeys(ctx, tx, db.ScanKeysParams{AfterName: p.AfterName, AfterKey: p.AfterKey, MaxKeys: int32(p.Max)})
	if err != nil {
		return nil, err
	}
	out := make([]txlimit.KeyRef, len(rows))
	for i, r := range rows {
		out[i] = txlimit.KeyRef{Name: r.Name, Key: r.Key}
	}
	return out, nil
}

// LockIdle implements txlimit.Store with FOR UPDATE SKIP LOCKED: it never
// waits for a row that live traffic holds.
func (s *Store) LockIdle(ctx context.Context, tx pgx.Tx, keys []txlimit.KeyRef, now *time.Time) ([]txlimit.IdleKey, time.Time, error) {
	p := db.LockIdleParams{Now: now, Names: make([]string, len(keys)), Keys: make([]string, len(keys))}
	for i, k := range keys {
		p.Names[i], p.Keys[i] = k.Name, k.Key
	}
	rows, err := s.queries.LockIdle(ctx, tx, p)
	if err != nil {
		return nil, time.Time{}, err
	}
	var out []txlimit.IdleKey
	var clock time.Time
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].Name != r.Name || out[len(out)-1].Key != r.Key {
			out = append(out, txlimit.IdleKey{Name: r.Name, Key: r.Key, Total: int(r.Total)})
		}
		last := &out[len(out)-1]
		last.Rows = append(last.Rows, txlimit.ShardRow{Shard: r.Shard, Value: r.Value, TS: r.Ts})
		if clock.IsZero() || r.Clock.Before(clock) {
			// clock_timestamp() is read per row. Judging every row at the
			// earliest reading is safe: a row full then is full later.
			clock = r.Clock
		}
	}
	return out, clock, nil
}
