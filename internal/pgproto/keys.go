package pgproto

import (
	"context"
	"slices"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// rowRef names one row.
type rowRef struct {
	name, key string
	shard     int32
}

// keyWrite is the new state of the rows 0..len(states)-1 of a key.
type keyWrite struct {
	name, key string
	states    []algo.State
}

// keyRow is a row of one of several keys, with the clock.
type keyRow struct {
	name, key string
	row       driver.Row
	clock     time.Time
}

// TakeAll is driver.Store.TakeAll: the insert that takes the locks in the
// canonical order and the read of the locked rows (one round trip on pgx),
// then the writes (or, for a denial, the removal of the rows the insert
// created).
func (pr Protocol) TakeAll(ctx context.Context, db DB, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	n := len(p.Takes)
	keys := make([]driver.TakeParams, n)
	index := make(map[driver.KeyRef]int, n)
	for i, j := range driver.CanonicalOrder(p.Takes) {
		keys[i] = p.Takes[j]
		index[driver.KeyRef{Name: keys[i].Name, Key: keys[i].Key}] = j
	}
	lt := LockTimer{On: p.TimeLocks}
	lockStart := lt.Start()
	createdRows, locked, err := pr.insertAndLockKeys(ctx, db, keys, p.Now)
	lt.Stop(lockStart)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	created := make(map[driver.KeyRef][]int32)
	for _, r := range createdRows {
		k := driver.KeyRef{Name: r.name, Key: r.key}
		created[k] = append(created[k], r.shard)
	}
	// had holds each key's rows as they were before InsertKeys: the rows
	// it created are full placeholders, which a reshard must not count.
	had := make([][]driver.Row, n)
	all := make([][]driver.Row, n)
	var at time.Time
	for _, r := range locked {
		k := driver.KeyRef{Name: r.name, Key: r.key}
		i := index[k]
		all[i] = append(all[i], r.row)
		if !slices.Contains(created[k], r.row.Shard) {
			had[i] = append(had[i], r.row)
		}
		if at.IsZero() {
			at = r.clock // clock_timestamp() is read per row, after every lock is held
		}
	}
	out, writes := driver.DecideAll(p, had, at)
	out.LockWait = lt.Total
	var kw []keyWrite
	var doomed []rowRef
	for i, t := range p.Takes {
		if writes[i] == nil {
			// A denied limit keeps its rows as they were: those
			// InsertKeys created (full, so equal to no row) go again.
			for _, sh := range created[driver.KeyRef{Name: t.Name, Key: t.Key}] {
				doomed = append(doomed, rowRef{name: t.Name, key: t.Key, shard: sh})
			}
			continue
		}
		kw = append(kw, keyWrite{name: t.Name, key: t.Key, states: out.Results[i].States})
		for _, sh := range driver.Extra(all[i], t.Shards) {
			doomed = append(doomed, rowRef{name: t.Name, key: t.Key, shard: sh})
		}
	}
	if len(kw) > 0 || len(doomed) > 0 {
		if err := pr.write(ctx, db, kw, doomed); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	return out, nil
}

// insertAndLockKeys runs InsertKeys and LockKeys for keys, which are in the
// canonical order, in one round trip, and returns the rows InsertKeys
// created and every row LockKeys returned, in its order. With SingleKey it
// runs InsertKeyShards for every key, then LockShards for every key, in the
// same order: the locks are taken in the order InsertKeys and LockKeys take
// them.
func (pr Protocol) insertAndLockKeys(ctx context.Context, db DB, keys []driver.TakeParams, now *time.Time) ([]rowRef, []keyRow, error) {
	var created []rowRef
	var locked []keyRow
	var calls []Call
	if pr.SingleKey {
		for _, k := range keys {
			full := k.Full()
			calls = append(calls, func(q pgdb.DBTX) error {
				shards, err := queries.InsertKeyShards(ctx, q, pgdb.InsertKeyShardsParams{
					Name: k.Name, Key: k.Key, Value: full.Value, Ts: micros(full.TS), Shards: int32(k.Shards),
				})
				for _, sh := range shards {
					created = append(created, rowRef{name: k.Name, key: k.Key, shard: sh})
				}
				return err
			})
		}
		for _, k := range keys {
			calls = append(calls, func(q pgdb.DBTX) error {
				rows, err := queries.LockShards(ctx, q, pgdb.LockShardsParams{Name: k.Name, Key: k.Key, Now: now})
				for _, r := range rows {
					locked = append(locked, keyRow{name: k.Name, key: k.Key,
						row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, clock: r.Clock})
				}
				return err
			})
		}
	} else {
		var names, ks, shards, vals, tss array
		for _, k := range keys {
			full := k.Full()
			names.text(k.Name)
			ks.text(k.Key)
			shards.int(int32(k.Shards))
			vals.float(full.Value)
			tss.time(micros(full.TS))
		}
		calls = []Call{func(q pgdb.DBTX) error {
			rows, err := queries.InsertKeys(ctx, q, pgdb.InsertKeysParams{
				Names: names.String(), Keys: ks.String(), ShardCounts: shards.String(), Vals: vals.String(), Tss: tss.String(),
			})
			for _, r := range rows {
				created = append(created, rowRef{name: r.Name, key: r.Key, shard: r.Shard})
			}
			return err
		}, func(q pgdb.DBTX) error {
			rows, err := queries.LockKeys(ctx, q, pgdb.LockKeysParams{Now: now, Names: names.String(), Keys: ks.String()})
			for _, r := range rows {
				locked = append(locked, keyRow{name: r.Name, key: r.Key,
					row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, clock: r.Clock})
			}
			return err
		}}
	}
	if err := Send(ctx, db, calls...); err != nil {
		return nil, nil, err
	}
	return created, locked, nil
}

// write stores every keyWrite (WriteShard for one state, whose plan stays
// generic; WriteKeyShards for several) and deletes the rows of doomed, in
// one round trip.
func (pr Protocol) write(ctx context.Context, db DB, writes []keyWrite, doomed []rowRef) error {
	var calls []Call
	for _, w := range writes {
		if len(w.states) == 1 {
			st := w.states[0]
			calls = append(calls, func(q pgdb.DBTX) error {
				return queries.WriteShard(ctx, q, pgdb.WriteShardParams{Name: w.name, Key: w.key, Shard: 0, Value: st.Value, Prev: st.Prev, Ts: micros(st.TS)})
			})
			continue
		}
		var shards, vals, prevs, tss array
		for i, st := range w.states {
			shards.int(int32(i))
			vals.float(st.Value)
			prevs.float(st.Prev)
			tss.time(micros(st.TS))
		}
		calls = append(calls, func(q pgdb.DBTX) error {
			return queries.WriteKeyShards(ctx, q, pgdb.WriteKeyShardsParams{
				Name: w.name, Key: w.key, Shards: shards.String(), Vals: vals.String(), Prevs: prevs.String(), Tss: tss.String(),
			})
		})
	}
	if len(doomed) > 0 {
		calls = append(calls, pr.deletes(ctx, doomed, nil)...)
	}
	return Send(ctx, db, calls...)
}

// deletes returns the calls that delete rows, which the transaction holds:
// one DeleteShards, or with SingleKey one DeleteKeyShards per key. Each adds
// the number of rows it deleted to *deleted when that is not nil.
func (pr Protocol) deletes(ctx context.Context, rows []rowRef, deleted *int64) []Call {
	count := func(n int64, err error) error {
		if deleted != nil {
			*deleted += n
		}
		return err
	}
	if !pr.SingleKey {
		var names, keys, shards array
		for _, r := range rows {
			names.text(r.name)
			keys.text(r.key)
			shards.int(r.shard)
		}
		return []Call{func(q pgdb.DBTX) error {
			return count(queries.DeleteShards(ctx, q, pgdb.DeleteShardsParams{Names: names.String(), Keys: keys.String(), Shards: shards.String()}))
		}}
	}
	var calls []Call
	for _, k := range byKey(rows) {
		calls = append(calls, func(q pgdb.DBTX) error {
			return count(queries.DeleteKeyShards(ctx, q, pgdb.DeleteKeyShardsParams{Name: k.name, Key: k.key, Shards: k.shards.String()}))
		})
	}
	return calls
}

// keyShards is some rows of one key.
type keyShards struct {
	name, key string
	shards    array
}

// byKey groups rows by key, the keys in the order of their first row.
func byKey(rows []rowRef) []*keyShards {
	var out []*keyShards
	index := map[[2]string]*keyShards{}
	for _, r := range rows {
		k, ok := index[[2]string{r.name, r.key}]
		if !ok {
			k = &keyShards{name: r.name, key: r.key}
			index[[2]string{r.name, r.key}] = k
			out = append(out, k)
		}
		k.shards.int(r.shard)
	}
	return out
}

// idleRow is a row LockIdle locked, with the number of rows its key has.
type idleRow struct {
	keyRow
	total int64
}

// Prune is driver.Store.Prune. The rows are locked with FOR UPDATE SKIP
// LOCKED, so a batch never waits for a row that live traffic holds: a key
// with a row held elsewhere is left for a later run.
func (pr Protocol) Prune(ctx context.Context, db DB, p driver.PruneParams) (driver.PruneResult, error) {
	scanned, err := queries.ScanKeys(ctx, db, pgdb.ScanKeysParams{AfterName: p.After.Name, AfterKey: p.After.Key, MaxKeys: int32(p.Max)})
	if err != nil || len(scanned) == 0 {
		return driver.PruneResult{}, err
	}
	last := scanned[len(scanned)-1]
	out := driver.PruneResult{Keys: len(scanned), Last: driver.KeyRef{Name: last.Name, Key: last.Key}}
	var known []driver.KeyRef
	for _, k := range scanned {
		if !p.Known(k.Name) {
			out.Unknown++
			continue
		}
		known = append(known, driver.KeyRef{Name: k.Name, Key: k.Key})
	}
	if len(known) == 0 {
		return out, nil
	}
	rows, err := pr.lockIdle(ctx, db, known, p.Now)
	if err != nil {
		return driver.PruneResult{}, err
	}
	// clock_timestamp() is read per row. Judging every row at the earliest
	// reading is safe: a row full then is full later.
	var at time.Time
	for _, r := range rows {
		if at.IsZero() || r.clock.Before(at) {
			at = r.clock
		}
	}
	var doomed []rowRef
	for i := 0; i < len(rows); {
		j := i
		var keyRows []driver.Row
		for ; j < len(rows) && rows[j].name == rows[i].name && rows[j].key == rows[i].key; j++ {
			keyRows = append(keyRows, rows[j].row)
		}
		// Delete a key only when this transaction holds every row of it.
		if int64(len(keyRows)) == rows[i].total && p.Full(rows[i].name, rows[i].key, keyRows, at) {
			for _, r := range keyRows {
				doomed = append(doomed, rowRef{name: rows[i].name, key: rows[i].key, shard: r.Shard})
			}
		}
		i = j
	}
	if len(doomed) > 0 {
		var n int64
		if err := Send(ctx, db, pr.deletes(ctx, doomed, &n)...); err != nil {
			return driver.PruneResult{}, err
		}
		out.Deleted = int(n)
	}
	return out, nil
}

// lockIdle runs LockIdle for keys (with SingleKey, LockIdleKey for each, in
// one round trip).
func (pr Protocol) lockIdle(ctx context.Context, db DB, keys []driver.KeyRef, now *time.Time) ([]idleRow, error) {
	var out []idleRow
	if !pr.SingleKey {
		var names, ks array
		for _, k := range keys {
			names.text(k.Name)
			ks.text(k.Key)
		}
		rows, err := queries.LockIdle(ctx, db, pgdb.LockIdleParams{Now: now, Names: names.String(), Keys: ks.String()})
		for _, r := range rows {
			out = append(out, idleRow{keyRow{r.Name, r.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, r.Clock}, r.Total})
		}
		return out, err
	}
	calls := make([]Call, len(keys))
	for i, k := range keys {
		calls[i] = func(q pgdb.DBTX) error {
			rows, err := queries.LockIdleKey(ctx, q, pgdb.LockIdleKeyParams{Name: k.Name, Key: k.Key, Now: now})
			for _, r := range rows {
				out = append(out, idleRow{keyRow{k.Name, k.Key, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, r.Clock}, r.Total})
			}
			return err
		}
	}
	return out, Send(ctx, db, calls...)
}

// Ping runs ProbeTable, which fails when the txlimit table or one of its
// columns is missing.
func Ping(ctx context.Context, db pgdb.DBTX) error { return queries.ProbeTable(ctx, db) }
