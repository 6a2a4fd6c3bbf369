package pgsqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/pgsqlstore/internal/db"
)

// The methods of the SingleKeyStatements option: the same operations as
// InsertAndLockKeys, LockIdle and DeleteShards, in statements that each touch
// the rows of one key, one round trip each.

// insertAndLockEachKey runs InsertKeyShards for every key, then LockShards
// for every key, in the canonical order of keys: the order of InsertKeys and
// LockKeys.
func (c conn) insertAndLockEachKey(ctx context.Context, tx *sql.Tx, keys []pgproto.KeyInsert, now *time.Time) ([]pgproto.RowRef, []pgproto.KeyRow, error) {
	var created []pgproto.RowRef
	for _, k := range keys {
		shards, err := c.q.InsertKeyShards(ctx, tx, db.InsertKeyShardsParams{
			Name: k.Name, Key: k.Key, Value: k.Full.Value, Ts: time.UnixMicro(k.Full.TS), Shards: k.Shards,
		})
		if err != nil {
			return nil, nil, err
		}
		for _, sh := range shards {
			created = append(created, pgproto.RowRef{Name: k.Name, Key: k.Key, Shard: sh})
		}
	}
	var locked []pgproto.KeyRow
	for _, k := range keys {
		rows, err := c.q.LockShards(ctx, tx, db.LockShardsParams{Name: k.Name, Key: k.Key, Now: now})
		if err != nil {
			return nil, nil, err
		}
		for _, r := range rows {
			locked = append(locked, pgproto.KeyRow{Name: k.Name, Key: k.Key,
				Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Clock: r.Clock})
		}
	}
	return created, locked, nil
}

// lockIdleEachKey runs LockIdleKey for every key, in their order.
func (c conn) lockIdleEachKey(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef, now *time.Time) ([]pgproto.IdleRow, error) {
	var out []pgproto.IdleRow
	for _, k := range keys {
		rows, err := c.q.LockIdleKey(ctx, tx, db.LockIdleKeyParams{Name: k.Name, Key: k.Key, Now: now})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out = append(out, pgproto.IdleRow{Name: k.Name, Key: k.Key,
				Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Total: r.Total, Clock: r.Clock})
		}
	}
	return out, nil
}

// deleteEachKey runs DeleteKeyShards for the rows of each key and returns
// how many rows they deleted.
func (c conn) deleteEachKey(ctx context.Context, tx *sql.Tx, rows []pgproto.RowRef) (int64, error) {
	var n int64
	for _, k := range pgproto.ByKey(rows) {
		var shards array
		for _, sh := range k.Shards {
			shards.int(sh)
		}
		d, err := c.q.DeleteKeyShards(ctx, tx, db.DeleteKeyShardsParams{Name: k.Name, Key: k.Key, Shards: shards.String()})
		if err != nil {
			return n, err
		}
		n += d
	}
	return n, nil
}
