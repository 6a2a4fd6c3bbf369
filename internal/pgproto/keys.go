package pgproto

import (
	"context"
	"slices"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// LockKeys runs InsertKeys and LockKeys for ls in one round trip (with
// SingleKey, InsertKeyShards and then LockShards for each key, which lock in
// the same order): the rows InsertKeys created are Created, the others Had.
// at is the clock of the first row, read once every lock is held.
func (d dialect) LockKeys(ctx context.Context, db DB, ls []driver.Limit, now *time.Time) ([]engine.Locked, time.Time, error) {
	out := make([]engine.Locked, len(ls))
	index := make(map[driver.KeyRef]int, len(ls))
	for i, l := range ls {
		index[driver.KeyRef{Name: l.Name, Key: l.Key}] = i
	}
	var at time.Time
	created := func(name, key string, shard int32) {
		k := &out[index[driver.KeyRef{Name: name, Key: key}]]
		k.Created = append(k.Created, shard)
	}
	locked := func(name, key string, r driver.Row, clock time.Time) {
		k := &out[index[driver.KeyRef{Name: name, Key: key}]]
		if !slices.Contains(k.Created, r.Shard) {
			k.Had = append(k.Had, r)
		}
		if at.IsZero() {
			at = clock
		}
	}
	var calls []Call
	if d.SingleKey {
		for _, l := range ls {
			full := l.Full()
			calls = append(calls, func(q pgdb.DBTX) error {
				shards, err := queries.InsertKeyShards(ctx, q, pgdb.InsertKeyShardsParams{
					Name: l.Name, Key: l.Key, Value: full.Value, Ts: time.UnixMicro(full.TS), Shards: int32(l.Shards),
				})
				for _, sh := range shards {
					created(l.Name, l.Key, sh)
				}
				return err
			})
		}
		for _, l := range ls {
			calls = append(calls, func(q pgdb.DBTX) error {
				rows, err := queries.LockShards(ctx, q, pgdb.LockShardsParams{Name: l.Name, Key: l.Key, Now: now})
				for _, r := range rows {
					locked(l.Name, l.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, r.Clock)
				}
				return err
			})
		}
	} else {
		var names, keys, shards, vals, tss array
		for _, l := range ls {
			full := l.Full()
			names.text(l.Name)
			keys.text(l.Key)
			shards.int(int32(l.Shards))
			vals.float(full.Value)
			tss.time(time.UnixMicro(full.TS))
		}
		calls = []Call{func(q pgdb.DBTX) error {
			rows, err := queries.InsertKeys(ctx, q, pgdb.InsertKeysParams{
				Names: names.String(), Keys: keys.String(), ShardCounts: shards.String(), Vals: vals.String(), Tss: tss.String(),
			})
			for _, r := range rows {
				created(r.Name, r.Key, r.Shard)
			}
			return err
		}, func(q pgdb.DBTX) error {
			rows, err := queries.LockKeys(ctx, q, pgdb.LockKeysParams{Now: now, Names: names.String(), Keys: keys.String()})
			for _, r := range rows {
				locked(r.Name, r.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, r.Clock)
			}
			return err
		}}
	}
	if err := Send(ctx, db, calls...); err != nil {
		return nil, time.Time{}, err
	}
	return out, at, nil
}

// Write runs InsertShards first for a key whose rows it does not hold all
// (a reshard to more shards), and then, in one round trip, a WriteShard for
// each key of one state (whose plan stays generic), a WriteKeyShards for
// each key of several, and the deletes.
func (d dialect) Write(ctx context.Context, db DB, writes []engine.KeyWrite, deletes []engine.RowRef) (int64, error) {
	var calls []Call
	for _, w := range writes {
		for sh := range int32(w.Shards) {
			if !w.Locked.Holds(sh) {
				if err := insertShards(ctx, db, w.Limit); err != nil {
					return 0, err
				}
				break
			}
		}
		if len(w.States) == 1 {
			s := w.States[0]
			calls = append(calls, func(q pgdb.DBTX) error {
				return queries.WriteShard(ctx, q, pgdb.WriteShardParams{Name: w.Name, Key: w.Key, Shard: 0, Value: s.Value, Prev: s.Prev, Ts: time.UnixMicro(s.TS),
					PausedUntil: pausedArg(w.Paused)})
			})
			continue
		}
		var shards, vals, prevs, tss array
		for i, st := range w.States {
			shards.int(int32(i))
			vals.float(st.Value)
			prevs.float(st.Prev)
			tss.time(time.UnixMicro(st.TS))
		}
		calls = append(calls, func(q pgdb.DBTX) error {
			return queries.WriteKeyShards(ctx, q, pgdb.WriteKeyShardsParams{
				Name: w.Name, Key: w.Key, Shards: shards.String(), Vals: vals.String(), Prevs: prevs.String(), Tss: tss.String(),
				PausedUntil: pausedArg(w.Paused),
			})
		})
	}
	var n int64
	if len(deletes) > 0 {
		calls = append(calls, d.deletes(ctx, deletes, &n)...)
	}
	return n, Send(ctx, db, calls...)
}

// deletes returns the calls that delete rows: one DeleteShards, or with
// SingleKey one DeleteKeyShards per key. Each adds the number of rows it
// deleted to *deleted.
func (d dialect) deletes(ctx context.Context, rows []engine.RowRef, deleted *int64) []Call {
	count := func(n int64, err error) error {
		*deleted += n
		return err
	}
	if !d.SingleKey {
		var names, keys, shards array
		for _, r := range rows {
			names.text(r.Name)
			keys.text(r.Key)
			shards.int(r.Shard)
		}
		return []Call{func(q pgdb.DBTX) error {
			return count(queries.DeleteShards(ctx, q, pgdb.DeleteShardsParams{Names: names.String(), Keys: keys.String(), Shards: shards.String()}))
		}}
	}
	var calls []Call
	var last *array
	for i, r := range rows {
		if i == 0 || r.KeyRef != rows[i-1].KeyRef {
			last = new(array)
			k := r.KeyRef
			shards := last
			calls = append(calls, func(q pgdb.DBTX) error {
				return count(queries.DeleteKeyShards(ctx, q, pgdb.DeleteKeyShardsParams{Name: k.Name, Key: k.Key, Shards: shards.String()}))
			})
		}
		last.int(r.Shard)
	}
	return calls
}

// ScanKeys runs ScanKeys, which locks nothing.
func (dialect) ScanKeys(ctx context.Context, db DB, after driver.KeyRef, max int) ([]engine.Key, error) {
	scanned, err := queries.ScanKeys(ctx, db, pgdb.ScanKeysParams{AfterName: after.Name, AfterKey: after.Key, MaxKeys: int32(max)})
	keys := make([]engine.Key, len(scanned))
	for i, k := range scanned {
		keys[i].KeyRef = driver.KeyRef{Name: k.Name, Key: k.Key}
	}
	return keys, err
}

// LockIdle runs LockIdle (with SingleKey, LockIdleKey for each key, in one
// round trip): FOR UPDATE SKIP LOCKED, with the number of rows each key has,
// so that a key is Whole when the transaction holds them all. clock_timestamp()
// is read per row; judging every row at the earliest reading is safe, since
// a row full then is full later.
func (d dialect) LockIdle(ctx context.Context, db DB, keys []engine.Key, now *time.Time) ([]engine.Held, time.Time, error) {
	var out []engine.Held
	var at time.Time
	add := func(name, key string, r driver.Row, total int64, clock time.Time) {
		k := driver.KeyRef{Name: name, Key: key}
		if len(out) == 0 || out[len(out)-1].KeyRef != k {
			out = append(out, engine.Held{KeyRef: k})
		}
		h := &out[len(out)-1]
		h.Rows = append(h.Rows, r)
		h.Whole = int64(len(h.Rows)) == total
		if at.IsZero() || clock.Before(at) {
			at = clock
		}
	}
	var calls []Call
	if d.SingleKey {
		for _, k := range keys {
			calls = append(calls, func(q pgdb.DBTX) error {
				rows, err := queries.LockIdleKey(ctx, q, pgdb.LockIdleKeyParams{Name: k.Name, Key: k.Key, Now: now})
				for _, r := range rows {
					add(k.Name, k.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, r.Total, r.Clock)
				}
				return err
			})
		}
	} else {
		var names, ks array
		for _, k := range keys {
			names.text(k.Name)
			ks.text(k.Key)
		}
		calls = []Call{func(q pgdb.DBTX) error {
			rows, err := queries.LockIdle(ctx, q, pgdb.LockIdleParams{Now: now, Names: names.String(), Keys: ks.String()})
			for _, r := range rows {
				add(r.Name, r.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, r.Total, r.Clock)
			}
			return err
		}}
	}
	return out, at, Send(ctx, db, calls...)
}

// Ping runs ProbeTable, which fails when the txlimit table or one of its
// columns is missing.
func Ping(ctx context.Context, db pgdb.DBTX) error { return queries.ProbeTable(ctx, db) }
