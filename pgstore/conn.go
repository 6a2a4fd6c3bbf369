package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/pgstore/internal/db"
)

// conn runs the statements of the PostgreSQL protocol (package pgproto) on
// a pgx.Tx, bound by the sqlc-generated code of internal/db. Where a method
// of pgproto.Conn is several statements, they go to the server in one
// pgx.Batch: one round trip. With singleKey (SingleKeyStatements) every
// statement touches the rows of one key.
type conn struct {
	q         *db.Queries
	singleKey bool
}

var _ pgproto.Conn[pgx.Tx] = conn{}

// TryLockShard opens the savepoint and locks the first free shard from
// start, in one round trip; with ReadAll it reads every row in the same
// statement.
func (c conn) TryLockShard(ctx context.Context, tx pgx.Tx, p driver.TakeParams, start int32) (pgproto.Tried, error) {
	b := &pgx.Batch{}
	b.Queue(pgproto.Savepoint)
	var out pgproto.Tried
	if p.ReadAll {
		_, err := c.q.TryLockShardAndRead(ctx, queuer{b}, db.TryLockShardAndReadParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		if err := queued(err); err != nil {
			return pgproto.Tried{}, err
		}
		out.Top = -1
	} else {
		_, err := c.q.TryLockShard(ctx, queuer{b}, db.TryLockShardParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		if err := queued(err); err != nil {
			return pgproto.Tried{}, err
		}
	}
	res := tx.SendBatch(ctx, b)
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
					out.All = append(out.All, driver.Row{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
					out.Top = max(out.Top, *r.Shard)
				}
				if r.LockedShard != nil {
					out.Row = driver.Row{Shard: *r.LockedShard, Value: *r.LockedValue, TS: *r.LockedTs}
					out.Locked = true
				}
				return nil
			})
		}
	default:
		var r db.TryLockShardRow
		err = res.QueryRow().Scan(&r.Shard, &r.Value, &r.Ts, &r.Clock, &r.TopShard)
		switch {
		case err == nil:
			out = pgproto.Tried{Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Top: r.TopShard, Now: r.Clock}
		case errors.Is(err, pgx.ErrNoRows):
			// Every row is held or missing; which of the two is unknown,
			// so say every shard may exist.
			out, err = pgproto.Tried{Top: int32(p.Shards - 1)}, nil
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return out, err
}

func (c conn) WaitShard(ctx context.Context, tx pgx.Tx, p driver.TakeParams, shard int32) (pgproto.Tried, error) {
	r, err := c.q.WaitShard(ctx, tx, db.WaitShardParams{Name: p.Name, Key: p.Key, Shard: shard, Now: p.Now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return pgproto.Tried{Top: -1}, nil
	case err != nil:
		return pgproto.Tried{}, err
	}
	return pgproto.Tried{Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Locked: true, Top: r.TopShard, Now: r.Clock}, nil
}

// KeepShard writes the row and releases the savepoint in one round trip.
func (c conn) KeepShard(ctx context.Context, tx pgx.Tx, w pgproto.RowWrite) error {
	b := &pgx.Batch{}
	err := queued(c.q.WriteShard(ctx, queuer{b}, db.WriteShardParams{
		Name: w.Name, Key: w.Key, Shard: w.Shard, Value: w.State.Value, Ts: time.UnixMicro(w.State.TS),
	}))
	if err != nil {
		return err
	}
	b.Queue(pgproto.Release)
	return tx.SendBatch(ctx, b).Close()
}

func (c conn) DropShard(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	b.Queue(pgproto.Rollback)
	b.Queue(pgproto.Release)
	return tx.SendBatch(ctx, b).Close()
}

func (c conn) ReadShards(ctx context.Context, tx pgx.Tx, name, key string, now *time.Time) (driver.ReadResult, error) {
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

func (c conn) LockShards(ctx context.Context, tx pgx.Tx, name, key string, now *time.Time) ([]pgproto.ClockedRow, error) {
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

func (c conn) InsertShards(ctx context.Context, tx pgx.Tx, l driver.Limit) error {
	full := l.Full()
	return c.q.InsertShards(ctx, tx, db.InsertShardsParams{
		Name: l.Name, Key: l.Key, Shards: int32(l.Shards), Value: full.Value, Ts: time.UnixMicro(full.TS),
	})
}

// Write sends every write and the delete in one round trip: a one-row
// UPDATE for an unsharded limit (whose plan stays generic), one UPDATE for
// the shards of a sharded one.
func (c conn) Write(ctx context.Context, tx pgx.Tx, writes []pgproto.KeyWrite, doomed []pgproto.RowRef) error {
	b := &pgx.Batch{}
	for _, w := range writes {
		var err error
		if len(w.States) == 1 {
			err = c.q.WriteShard(ctx, queuer{b}, db.WriteShardParams{
				Name: w.Name, Key: w.Key, Shard: 0, Value: w.States[0].Value, Ts: time.UnixMicro(w.States[0].TS),
			})
		} else {
			p := db.WriteKeyShardsParams{Name: w.Name, Key: w.Key,
				Shards: make([]int32, len(w.States)), Vals: make([]float64, len(w.States)), Tss: make([]time.Time, len(w.States))}
			for i, st := range w.States {
				p.Shards[i], p.Vals[i], p.Tss[i] = int32(i), st.Value, time.UnixMicro(st.TS)
			}
			err = c.q.WriteKeyShards(ctx, queuer{b}, p)
		}
		if err := queued(err); err != nil {
			return err
		}
	}
	switch {
	case len(doomed) == 0:
	case c.singleKey:
		if err := c.queueDeletes(ctx, b, doomed); err != nil {
			return err
		}
	default:
		if _, err := c.q.DeleteShards(ctx, queuer{b}, deleteParams(doomed)); queued(err) != nil {
			return queued(err)
		}
	}
	if len(b.QueuedQueries) == 1 {
		q := b.QueuedQueries[0]
		_, err := tx.Exec(ctx, q.SQL, q.Arguments...)
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}

func (c conn) DeleteKey(ctx context.Context, tx pgx.Tx, name, key string) error {
	return c.q.DeleteKey(ctx, tx, db.DeleteKeyParams{Name: name, Key: key})
}

// InsertAndLockKeys sends InsertKeys and LockKeys in one round trip.
func (c conn) InsertAndLockKeys(ctx context.Context, tx pgx.Tx, keys []pgproto.KeyInsert, now *time.Time) ([]pgproto.RowRef, []pgproto.KeyRow, error) {
	if c.singleKey {
		return c.insertAndLockEachKey(ctx, tx, keys, now)
	}
	n := len(keys)
	ins := db.InsertKeysParams{
		Names: make([]string, n), Keys: make([]string, n), ShardCounts: make([]int32, n),
		Vals: make([]float64, n), Tss: make([]time.Time, n),
	}
	for i, k := range keys {
		ins.Names[i], ins.Keys[i], ins.ShardCounts[i], ins.Vals[i], ins.Tss[i] = k.Name, k.Key, k.Shards, k.Full.Value, time.UnixMicro(k.Full.TS)
	}
	b := &pgx.Batch{}
	_, err := c.q.InsertKeys(ctx, queuer{b}, ins)
	if err = queued(err); err == nil {
		_, err = c.q.LockKeys(ctx, queuer{b}, db.LockKeysParams{Now: now, Names: ins.Names, Keys: ins.Keys})
		err = queued(err)
	}
	if err != nil {
		return nil, nil, err
	}
	res := tx.SendBatch(ctx, b)
	var created []pgproto.RowRef
	var locked []pgproto.KeyRow
	rows, err := res.Query()
	if err == nil {
		var r db.InsertKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard}, func() error {
			created = append(created, pgproto.RowRef{Name: r.Name, Key: r.Key, Shard: r.Shard})
			return nil
		})
	}
	if err == nil {
		rows, err = res.Query()
	}
	if err == nil {
		var r db.LockKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard, &r.Value, &r.Ts, &r.Clock}, func() error {
			locked = append(locked, pgproto.KeyRow{Name: r.Name, Key: r.Key, Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Clock: r.Clock})
			return nil
		})
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	return created, locked, nil
}

func (c conn) ScanKeys(ctx context.Context, tx pgx.Tx, after driver.KeyRef, max int) ([]driver.KeyRef, error) {
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

func (c conn) LockIdle(ctx context.Context, tx pgx.Tx, keys []driver.KeyRef, now *time.Time) ([]pgproto.IdleRow, error) {
	if c.singleKey {
		return c.lockIdleEachKey(ctx, tx, keys, now)
	}
	p := db.LockIdleParams{Now: now, Names: make([]string, len(keys)), Keys: make([]string, len(keys))}
	for i, k := range keys {
		p.Names[i], p.Keys[i] = k.Name, k.Key
	}
	rows, err := c.q.LockIdle(ctx, tx, p)
	if err != nil {
		return nil, err
	}
	out := make([]pgproto.IdleRow, len(rows))
	for i, r := range rows {
		out[i] = pgproto.IdleRow{Name: r.Name, Key: r.Key, Row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, Total: r.Total, Clock: r.Clock}
	}
	return out, nil
}

func (c conn) DeleteShards(ctx context.Context, tx pgx.Tx, rows []pgproto.RowRef) (int64, error) {
	if c.singleKey {
		return c.deleteEachKey(ctx, tx, rows)
	}
	return c.q.DeleteShards(ctx, tx, deleteParams(rows))
}

func deleteParams(rows []pgproto.RowRef) db.DeleteShardsParams {
	p := db.DeleteShardsParams{Names: make([]string, len(rows)), Keys: make([]string, len(rows)), Shards: make([]int32, len(rows))}
	for i, r := range rows {
		p.Names[i], p.Keys[i], p.Shards[i] = r.Name, r.Key, r.Shard
	}
	return p
}

// TakeRow runs the one-statement take of p: TakeBucket or TakeWindow by the
// limit's kind, TakeReserve for a reservation.
func (c conn) TakeRow(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (algo.State, time.Time, bool, error) {
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
	return pgproto.TakenRow(value, ts, clock, errors.Is(err, pgx.ErrNoRows), err)
}
