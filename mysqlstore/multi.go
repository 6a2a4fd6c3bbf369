package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// keyRef is a (name, key) in the JSON arrays of Tops (rows.sql).
type keyRef struct{ name, key string }

func (k keyRef) MarshalJSON() ([]byte, error) {
	return json.Marshal([]string{hexOf(k.name), hexOf(k.key)})
}

// takeAll is driver.Store.TakeAll: every row of every limit created when
// missing and locked in the canonical order (name, then key, byte by byte,
// then shard), whatever the order of p.Takes, so that two callers can never
// deadlock on them; then decided in Go (driver.DecideAll) and written, or,
// for a denial, the placeholder rows it created deleted again.
func takeAll(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	var start time.Time
	if p.TimeLocks {
		start = time.Now()
	}
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	order := driver.CanonicalOrder(p.Takes)
	refs := make([]keyRef, len(order))
	limits := make([]driver.Limit, len(order))
	index := make(map[keyRef]int, len(order))
	for i, j := range order {
		t := p.Takes[j]
		refs[i] = keyRef{t.Name, t.Key}
		limits[i] = t.Limit
		index[refs[i]] = j
	}
	// The highest shard of each key first (a read that locks nothing), so
	// that rows another config left beyond Shards are locked in their
	// place in the order rather than after every key.
	tops, err := readTops(ctx, tx, refs)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	if err := ensure(ctx, tx, limits...); err != nil {
		return driver.TakeAllResult{}, err
	}
	var lockList []rowRef
	for i, j := range order {
		t := p.Takes[j]
		for sh := range max(t.Shards, tops[i]+1) {
			lockList = append(lockList, rowRef{name: t.Name, key: t.Key, shard: int32(sh)})
		}
	}
	arg, err := json.Marshal(lockList)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	rows, err := tx.QueryContext(ctx, lockRowsSQL, arg)
	if err != nil {
		return driver.TakeAllResult{}, wrap(ctx, tx, "lock the limits' rows", err)
	}
	defer rows.Close()
	had := make([][]driver.Row, len(p.Takes))
	all := make([][]driver.Row, len(p.Takes))
	created := make([][]int32, len(p.Takes))
	var at time.Time
	for rows.Next() {
		var i int
		var r driver.Row
		var clock time.Time
		if err := rows.Scan(&i, &r.Shard, &r.Value, &r.Prev, &r.TS, &clock); err != nil {
			return driver.TakeAllResult{}, wrap(ctx, tx, "lock the limits' rows", err)
		}
		if err := checkUTC(r.TS, clock); err != nil {
			return driver.TakeAllResult{}, err
		}
		at = clock
		j := index[keyRef{lockList[i-1].name, lockList[i-1].key}]
		t := p.Takes[j]
		all[j] = append(all[j], r)
		if int(r.Shard) < t.Shards && isPlaceholder(t.Limit, r) {
			created[j] = append(created[j], r.Shard)
		} else {
			had[j] = append(had[j], r)
		}
	}
	if err := rows.Err(); err != nil {
		return driver.TakeAllResult{}, wrap(ctx, tx, "lock the limits' rows", err)
	}
	if err := rows.Close(); err != nil {
		return driver.TakeAllResult{}, wrap(ctx, tx, "lock the limits' rows", err)
	}
	if p.Now != nil {
		at = time.UnixMicro(p.Now.UnixMicro()).UTC()
	}
	var lockWait time.Duration
	if p.TimeLocks {
		lockWait = time.Since(start)
	}
	out, writes := driver.DecideAll(p, had, at)
	out.LockWait = lockWait
	var ws []rowWrite
	var doomed []rowRef
	for j, t := range p.Takes {
		if writes[j] == nil {
			// A limit that keeps its rows: the placeholders go again.
			for _, sh := range created[j] {
				doomed = append(doomed, rowRef{name: t.Name, key: t.Key, shard: sh})
			}
			continue
		}
		for _, r := range writes[j] {
			ws = append(ws, put(t.Limit, r.Shard, r.State()))
		}
		for _, sh := range driver.Extra(all[j], t.Shards) {
			doomed = append(doomed, rowRef{name: t.Name, key: t.Key, shard: sh})
		}
	}
	return out, write(ctx, tx, ws, doomed)
}

// readTops returns the highest shard of each key (-1 for none) as the
// transaction's snapshot has it.
func readTops(ctx context.Context, tx *sql.Tx, refs []keyRef) ([]int, error) {
	arg, err := json.Marshal(refs)
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, topsSQL, arg)
	if err != nil {
		return nil, wrap(ctx, tx, "read the limits' shards", err)
	}
	defer rows.Close()
	tops := make([]int, len(refs))
	for rows.Next() {
		var i, top int
		if err := rows.Scan(&i, &top); err != nil {
			return nil, wrap(ctx, tx, "read the limits' shards", err)
		}
		tops[i-1] = top
	}
	return tops, wrap(ctx, tx, "read the limits' shards", rows.Err())
}
