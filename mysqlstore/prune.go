package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	gen "github.com/txlimit/txlimit/mysqlstore/internal/db"
)

// prune is driver.Store.Prune. It reads the next keys after the cursor
// with their rows' count and highest shard, locking nothing, then locks
// the rows of the known ones that no other transaction holds, and deletes
// the rows of every key it holds whole (every row the scan counted) and
// that p.Full says is full.
func prune(ctx context.Context, tx *sql.Tx, p driver.PruneParams) (driver.PruneResult, error) {
	keys, err := queries.ScanKeys(ctx, tx, gen.ScanKeysParams{AfterName: []byte(p.After.Name), AfterKey: []byte(p.After.Key), Limit: int32(p.Max)})
	if err != nil || len(keys) == 0 {
		return driver.PruneResult{}, wrap(ctx, tx, "scan keys", err)
	}
	last := keys[len(keys)-1]
	out := driver.PruneResult{Keys: len(keys), Last: driver.KeyRef{Name: string(last.Name), Key: string(last.Key)}}
	var list []rowRef
	total := map[keyRef]int64{}
	for _, k := range keys {
		if !p.Known(string(k.Name)) {
			out.Unknown++
			continue
		}
		ref := keyRef{string(k.Name), string(k.Key)}
		total[ref] = k.Total
		for sh := range k.Top + 1 {
			list = append(list, rowRef{name: ref.name, key: ref.key, shard: int32(sh)})
		}
	}
	if len(list) == 0 {
		return out, nil
	}
	arg, err := json.Marshal(list)
	if err != nil {
		return driver.PruneResult{}, err
	}
	rows, err := tx.QueryContext(ctx, lockIdleSQL, arg)
	if err != nil {
		return driver.PruneResult{}, wrap(ctx, tx, "lock idle rows", err)
	}
	defer rows.Close()
	held := map[keyRef][]driver.Row{}
	var order []keyRef
	var at time.Time
	for rows.Next() {
		var i int
		var r driver.Row
		var clock time.Time
		if err := rows.Scan(&i, &r.Shard, &r.Value, &r.Prev, &r.TS, &clock); err != nil {
			return driver.PruneResult{}, wrap(ctx, tx, "lock idle rows", err)
		}
		if err := checkUTC(r.TS, clock); err != nil {
			return driver.PruneResult{}, err
		}
		at = clock
		ref := keyRef{list[i-1].name, list[i-1].key}
		if _, ok := held[ref]; !ok {
			order = append(order, ref)
		}
		held[ref] = append(held[ref], r)
	}
	if err := rows.Err(); err != nil {
		return driver.PruneResult{}, wrap(ctx, tx, "lock idle rows", err)
	}
	if err := rows.Close(); err != nil {
		return driver.PruneResult{}, wrap(ctx, tx, "lock idle rows", err)
	}
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.PruneResult{}, err
		}
		at = time.UnixMicro(p.Now.UnixMicro()).UTC()
	}
	var doomed []rowRef
	for _, ref := range order {
		rs := held[ref]
		// Only a key this transaction holds whole: a key with a row held
		// elsewhere is in use, and is left for a later run.
		if int64(len(rs)) != total[ref] || !p.Full(ref.name, ref.key, rs, at) {
			continue
		}
		for _, r := range rs {
			doomed = append(doomed, rowRef{name: ref.name, key: ref.key, shard: r.Shard})
		}
	}
	if len(doomed) > 0 {
		n, err := deleteRows(ctx, tx, doomed)
		if err != nil {
			return driver.PruneResult{}, err
		}
		out.Deleted = int(n)
	}
	return out, nil
}
