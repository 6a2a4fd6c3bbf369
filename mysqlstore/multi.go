package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
)

// LockKeys creates the missing rows of every limit of ls (ensure) and locks
// all their rows (LockRows), a statement each, in the canonical order (name,
// then key, byte by byte, then shard). The highest shard of each key is
// read first, locking nothing, so that rows another config left beyond
// Shards are locked in their place in that order.
func (s *backend) LockKeys(ctx context.Context, tx *sql.Tx, ls []driver.Limit, now *time.Time) ([]engine.Locked, time.Time, error) {
	refs := make([]driver.KeyRef, len(ls))
	for i, l := range ls {
		refs[i] = driver.KeyRef{Name: l.Name, Key: l.Key}
	}
	tops, err := readTops(ctx, tx, refs)
	if err != nil {
		return nil, time.Time{}, err
	}
	if err := ensure(ctx, tx, ls...); err != nil {
		return nil, time.Time{}, err
	}
	for i, l := range ls {
		tops[i] = max(l.Shards-1, tops[i])
	}
	rows, at, err := lockRows(ctx, tx, lockRowsSQL, "lock the limits' rows", refs, tops)
	if err != nil {
		return nil, time.Time{}, err
	}
	at = clockOr(now, at)
	out := make([]engine.Locked, len(ls))
	for i, l := range ls {
		out[i] = held(l, rows[i], at)
	}
	return out, at, nil
}

// readTops returns the highest shard of each key (-1 for none) as the
// transaction's snapshot has it.
func readTops(ctx context.Context, tx *sql.Tx, refs []driver.KeyRef) ([]int, error) {
	list := make([][]any, len(refs))
	for i, k := range refs {
		list[i] = jsonRef(k)
	}
	arg, _ := json.Marshal(list) // strings and numbers: no error
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

// lockRows locks rows 0..tops[i] of each key of keys, in that order, with
// query (LockRows, which waits for the rows other transactions hold, or
// LockIdle, which passes over them), and reads them: out[i] are the rows
// of keys[i] it holds, at the clock of the last.
func lockRows(ctx context.Context, tx *sql.Tx, query, op string, keys []driver.KeyRef, tops []int) (out [][]driver.Row, at time.Time, err error) {
	var list [][]any
	var owner []int
	for i, k := range keys {
		for sh := range tops[i] + 1 {
			list = append(list, jsonRef(k, int32(sh)))
			owner = append(owner, i)
		}
	}
	out = make([][]driver.Row, len(keys))
	if len(list) == 0 {
		return out, at, nil
	}
	arg, _ := json.Marshal(list) // strings and numbers: no error
	rows, err := tx.QueryContext(ctx, query, arg)
	if err != nil {
		return nil, at, wrap(ctx, tx, op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var r driver.Row
		var paused sql.NullTime
		if err := rows.Scan(&i, &r.Shard, &r.Value, &r.Prev, &r.TS, &paused, &at); err != nil {
			return nil, at, wrap(ctx, tx, op, err)
		}
		r.Paused = pausedOf(paused)
		if err := checkUTC(r.TS, at); err != nil {
			return nil, at, err
		}
		out[owner[i-1]] = append(out[owner[i-1]], r)
	}
	return out, at, wrap(ctx, tx, op, rows.Err())
}
