package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/pgstore/internal/db"
)

// The methods of the SingleKeyStatements option: the same operations as
// InsertAndLockKeys, LockIdle and DeleteShards, in statements that each touch
// the rows of one key, all of them sent in one batch as before.

// insertAndLockEachKey sends InsertKeyShards for every key, then LockShards
// for every key, in the canonical order of keys: the order of InsertKeys and
// LockKeys, one round trip.
func (c conn) insertAndLockEachKey(ctx context.Context, tx pgx.Tx, keys []pgproto.KeyInsert, now *time.Time) ([]pgproto.RowRef, []pgproto.KeyRow, error) {
	b := &pgx.Batch{}
	for _, k := range keys {
		_, err := c.q.InsertKeyShards(ctx, queuer{b}, db.InsertKeyShardsParams{
			Name: k.Name, Key: k.Key, Value: k.Full.Value, Ts: time.UnixMicro(k.Full.TS), Shards: k.Shards,
		})
		if err := queued(err); err != nil {
			return nil, nil, err
		}
	}
	for _, k := range keys {
		_, err := c.q.LockShards(ctx, queuer{b}, db.LockShardsParams{Name: k.Name, Key: k.Key, Now: now})
		if err := queued(err); err != nil {
			return nil, nil, err
		}
	}
	res := tx.SendBatch(ctx, b)
	var (
		created []pgproto.RowRef
		locked  []pgproto.KeyRow
		err     error
	)
	for i := 0; i < len(keys) && err == nil; i++ {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var shard int32
			_, err = pgx.ForEachRow(rows, []any{&shard}, func() error {
				created = append(created, pgproto.RowRef{Name: keys[i].Name, Key: keys[i].Key, Shard: shard})
				return nil
			})
		}
	}
	for i := 0; i < len(keys) && err == nil; i++ {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var r db.LockShardsRow
			_, err = pgx.ForEachRow(rows, []any{&r.Shard, &r.Value, &r.Ts, &r.Clock}, func() error {
				locked = append(locked, pgproto.KeyRow{Name: keys[i].Name, Key: keys[i].Key,
					Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Clock: r.Clock})
				return nil
			})
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	return created, locked, nil
}

// lockIdleEachKey sends LockIdleKey for every key, in their order, in one
// round trip.
func (c conn) lockIdleEachKey(ctx context.Context, tx pgx.Tx, keys []driver.KeyRef, now *time.Time) ([]pgproto.IdleRow, error) {
	b := &pgx.Batch{}
	for _, k := range keys {
		_, err := c.q.LockIdleKey(ctx, queuer{b}, db.LockIdleKeyParams{Name: k.Name, Key: k.Key, Now: now})
		if err := queued(err); err != nil {
			return nil, err
		}
	}
	res := tx.SendBatch(ctx, b)
	var (
		out []pgproto.IdleRow
		err error
	)
	for i := 0; i < len(keys) && err == nil; i++ {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var r db.LockIdleKeyRow
			_, err = pgx.ForEachRow(rows, []any{&r.Shard, &r.Value, &r.Ts, &r.Total, &r.Clock}, func() error {
				out = append(out, pgproto.IdleRow{Name: keys[i].Name, Key: keys[i].Key,
					Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Total: r.Total, Clock: r.Clock})
				return nil
			})
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return out, err
}

// queueDeletes queues DeleteKeyShards for the rows of each key.
func (c conn) queueDeletes(ctx context.Context, b *pgx.Batch, rows []pgproto.RowRef) error {
	for _, k := range pgproto.ByKey(rows) {
		_, err := c.q.DeleteKeyShards(ctx, queuer{b}, db.DeleteKeyShardsParams{Name: k.Name, Key: k.Key, Shards: k.Shards})
		if err := queued(err); err != nil {
			return err
		}
	}
	return nil
}

// deleteEachKey runs DeleteKeyShards for the rows of each key, in one round
// trip, and returns how many rows they deleted.
func (c conn) deleteEachKey(ctx context.Context, tx pgx.Tx, rows []pgproto.RowRef) (int64, error) {
	b := &pgx.Batch{}
	if err := c.queueDeletes(ctx, b, rows); err != nil {
		return 0, err
	}
	res := tx.SendBatch(ctx, b)
	var (
		n   int64
		err error
	)
	for range b.Len() {
		var tag pgconn.CommandTag
		if tag, err = res.Exec(); err != nil {
			break
		}
		n += tag.RowsAffected()
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return n, err
}
