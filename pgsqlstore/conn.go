package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/pgsqlstore/internal/db"
)

// conn runs the statements of the PostgreSQL protocol (package pgproto) on
// a *sql.Tx, bound by the sqlc-generated code of internal/db. database/sql
// sends one statement per round trip, so the pairs pgstore batches (the
// savepoint and the try-lock, the write and the release, InsertKeys and
// LockKeys, the writes of several keys) cost one round trip each here; the
// two statements that drop the savepoint, having no parameters, go as one
// simple-protocol query. With singleKey (SingleKeyStatements) every
// statement touches the rows of one key.
type conn struct {
	q         *db.Queries
	singleKey bool
}

var _ pgproto.Conn[*sql.Tx] = conn{}

func (c conn) TryLockShard(ctx context.Context, tx *sql.Tx, p driver.TakeParams, start int32) (pgproto.Tried, error) {
	if _, err := tx.ExecContext(ctx, pgproto.Savepoint); err != nil {
		return pgproto.Tried{}, err
	}
	if p.ReadAll {
		rows, err := c.q.TryLockShardAndRead(ctx, tx, db.TryLockShardAndReadParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		if err != nil {
			return pgproto.Tried{}, err
		}
		out := pgproto.Tried{Top: -1}
		for _, r := range rows {
			out.Now = r.Clock
			if r.Shard != nil {
				out.All = append(out.All, driver.Row{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
				out.Top = max(out.Top, *r.Shard)
			}
			if r.LockedShard != nil {
				out.Row = driver.Row{Shard: *r.LockedShard, Value: *r.LockedValue, TS: *r.LockedTs}
				out.Locked = true
			}
		}
		return out, nil
	}
	r, err := c.q.TryLockShard(ctx, tx, db.TryLockShardParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Every row is held or missing; which of the two is unknown, so
		// say every shard may exist.
		return pgproto.Tried{Top: int32(p.Shards - 1)}, nil
	case err != nil:
		return pgproto.Tried{}, err
	}
	return pgproto.Tried{Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Top: r.TopShard, Now: r.Clock}, nil
}

func (c conn) WaitShard(ctx context.Context, tx *sql.Tx, p driver.TakeParams, shard int32) (pgproto.Tried, error) {
	r, err := c.q.WaitShard(ctx, tx, db.WaitShardParams{Name: p.Name, Key: p.Key, Shard: shard, Now: p.Now})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return pgproto.Tried{Top: -1}, nil
	case err != nil:
		return pgproto.Tried{}, err
	}
	return pgproto.Tried{Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Top: r.TopShard, Now: r.Clock}, nil
}

func (c conn) KeepShard(ctx context.Context, tx *sql.Tx, w pgproto.RowWrite) error {
	err := c.q.WriteShard(ctx, tx, db.WriteShardParams{
		Name: w.Name, Key: w.Key, Shard: w.Shard, Value: w.State.Value, Ts: time.UnixMicro(w.State.TS),
	})
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, pgproto.Release)
	return err
}

func (c conn) DropShard(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, pgproto.DropSavepoint)
	return err
}

func (c conn) ReadShards(ctx context.Context, tx *sql.Tx, name, key string, now *time.Time) (driver.ReadResult, error) {
	rows, err := c.q.ReadShards(ctx, tx, db.ReadShardsParams{Name: name, Key: key, Now: now})
	if err != nil {
		return driver.ReadResult{}, err
	}
	var out driver.ReadResult
	for _, r := range rows {
		out.At = r.Clock
		if r.Shard != nil {
			out.Rows = append(out.Rows, driver.Row{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
		}
	}
	return out, nil
}

func (c conn) LockShards(ctx context.Context, tx *sql.Tx, name, key string, now *time.Time) ([]pgproto.ClockedRow, error) {
	rows, err := c.q.LockShards(ctx, tx, db.LockShardsParams{Name: name, Key: key, Now: now})
	if err != nil {
		return nil, err
	}
	out := make([]pgproto.ClockedRow, len(rows))
	for i, r := range rows {
		out[i] = pgproto.ClockedRow{Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Clock: r.Clock}
	}
	return out, nil
}

func (c conn) InsertShards(ctx context.Context, tx *sql.Tx, l driver.Limit) error {
	full := l.Full()
	return c.q.InsertShards(ctx, tx, db.InsertShardsParams{
		Name: l.Name, Key: l.Key, Shards: int32(l.Shards), Value: full.Value, Ts: time.UnixMicro(full.TS),
	})
}

func (c conn) Write(ctx context.Context, tx *sql.Tx, writes []pgproto.KeyWrite, doomed []pgproto.RowRef) error {
	for _, w := range writes {
		var err error
		if len(w.States) == 1 {
			err = c.q.WriteShard(ctx, tx, db.WriteShardParams{
				Name: w.Name, Key: w.Key, Shard: 0, Value: w.States[0].Value, Ts: time.UnixMicro(w.States[0].TS),
			})
		} else {
			var shards, vals, tss array
			for i, st := range w.States {
				shards.int(int32(i))
				vals.float(st.Value)
				tss.time(time.UnixMicro(st.TS))
			}
			err = c.q.WriteKeyShards(ctx, tx, db.WriteKeyShardsParams{
				Name: w.Name, Key: w.Key, Shards: shards.String(), Vals: vals.String(), Tss: tss.String(),
			})
		}
		if err != nil {
			return err
		}
	}
	if len(doomed) > 0 {
		_, err := c.DeleteShards(ctx, tx, doomed)
		return err
	}
	return nil
}

func (c conn) DeleteKey(ctx context.Context, tx *sql.Tx, name, key string) error {
	return c.q.DeleteKey(ctx, tx, db.DeleteKeyParams{Name: name, Key: key})
}

func (c conn) InsertAndLockKeys(ctx context.Context, tx *sql.Tx, keys []pgproto.KeyInsert, now *time.Time) ([]pgproto.RowRef, []pgproto.KeyRow, error) {
	if c.singleKey {
		return c.insertAndLockEachKey(ctx, tx, keys, now)
	}
	var names, ks, counts, vals, tss array
	for _, k := range keys {
		names.text(k.Name)
		ks.text(k.Key)
		counts.int(k.Shards)
		vals.float(k.Full.Value)
		tss.time(time.UnixMicro(k.Full.TS))
	}
	ins, err := c.q.InsertKeys(ctx, tx, db.InsertKeysParams{
		Names: names.String(), Keys: ks.String(), ShardCounts: counts.String(), Vals: vals.String(), Tss: tss.String(),
	})
	if err != nil {
		return nil, nil, err
	}
	created := make([]pgproto.RowRef, len(ins))
	for i, r := range ins {
		created[i] = pgproto.RowRef{Name: r.Name, Key: r.Key, Shard: r.Shard}
	}
	locked, err := c.q.LockKeys(ctx, tx, db.LockKeysParams{Now: now, Names: names.String(), Keys: ks.String()})
	if err != nil {
		return nil, nil, err
	}
	rows := make([]pgproto.KeyRow, len(locked))
	for i, r := range locked {
		rows[i] = pgproto.KeyRow{Name: r.Name, Key: r.Key, Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Clock: r.Clock}
	}
	return created, rows, nil
}

func (c conn) ScanKeys(ctx context.Context, tx *sql.Tx, after driver.KeyRef, max int) ([]driver.KeyRef, error) {
	keys, err := c.q.ScanKeys(ctx, tx, db.ScanKeysParams{AfterName: after.Name, AfterKey: after.Key, MaxKeys: int32(max)})
	if err != nil {
		return nil, err
	}
	out := make([]driver.KeyRef, len(keys))
	for i, k := range keys {
		out[i] = driver.KeyRef{Name: k.Name, Key: k.Key}
	}
	return out, nil
}

func (c conn) LockIdle(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef, now *time.Time) ([]pgproto.IdleRow, error) {
	if c.singleKey {
		return c.lockIdleEachKey(ctx, tx, keys, now)
	}
	var names, ks array
	for _, k := range keys {
		names.text(k.Name)
		ks.text(k.Key)
	}
	rows, err := c.q.LockIdle(ctx, tx, db.LockIdleParams{Now: now, Names: names.String(), Keys: ks.String()})
	if err != nil {
		return nil, err
	}
	out := make([]pgproto.IdleRow, len(rows))
	for i, r := range rows {
		out[i] = pgproto.IdleRow{Name: r.Name, Key: r.Key, Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Total: r.Total, Clock: r.Clock}
	}
	return out, nil
}

func (c conn) DeleteShards(ctx context.Context, tx *sql.Tx, rows []pgproto.RowRef) (int64, error) {
	if c.singleKey {
		return c.deleteEachKey(ctx, tx, rows)
	}
	var names, keys, shards array
	for _, r := range rows {
		names.text(r.Name)
		keys.text(r.Key)
		shards.int(r.Shard)
	}
	return c.q.DeleteShards(ctx, tx, db.DeleteShardsParams{Names: names.String(), Keys: keys.String(), Shards: shards.String()})
}

// TakeRow runs one of the one-statement takes: TakeBucket or TakeWindow for
// a call that is not a reservation (the common case, in the leanest
// statement), TakeRow for a reservation.
func (c conn) TakeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (algo.State, time.Time, bool, error) {
	cfg, full := p.Config, p.Full()
	fresh, ok := driver.Fresh(p)
	var (
		value     float64
		ts, clock time.Time
		err       error
	)
	switch {
	case p.Reserve:
		var r db.TakeReserveRow
		r, err = c.q.TakeReserve(ctx, tx, db.TakeReserveParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FreshOk: ok, FullTs: time.UnixMicro(full.TS), Now: p.Now,
			Kind: int32(cfg.Kind), Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, MaxReserved: cfg.MaxReserved,
			Count: p.Count,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	case cfg.Kind == algo.FixedWindow:
		var r db.TakeWindowRow
		r, err = c.q.TakeWindow(ctx, tx, db.TakeWindowParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FreshOk: ok, FullTs: time.UnixMicro(full.TS), Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	default:
		var r db.TakeBucketRow
		r, err = c.q.TakeBucket(ctx, tx, db.TakeBucketParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FreshOk: ok, FullTs: time.UnixMicro(full.TS), Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	}
	return pgproto.TakenRow(value, ts, clock, errors.Is(err, sql.ErrNoRows), err)
}
