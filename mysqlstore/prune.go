package mysqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	gen "github.com/txlimit/txlimit/mysqlstore/internal/db"
)

// ScanKeys implements engine.Dialect: the next keys after the cursor, in
// primary-key order (bytes), with their rows' count and highest shard,
// locking nothing.
func (s *backend) ScanKeys(ctx context.Context, tx *sql.Tx, after driver.KeyRef, max int) ([]engine.Key, error) {
	keys, err := queries.ScanKeys(ctx, tx, gen.ScanKeysParams{AfterName: []byte(after.Name), AfterKey: []byte(after.Key), Limit: int32(max)})
	if err != nil {
		return nil, wrap(ctx, tx, "scan keys", err)
	}
	out := make([]engine.Key, len(keys))
	for i, k := range keys {
		out[i] = engine.Key{KeyRef: driver.KeyRef{Name: string(k.Name), Key: string(k.Key)}, Rows: k.Total, Top: int32(k.Top)}
	}
	return out, nil
}

// LockIdle implements engine.Dialect: the rows the scan counted, locked by
// primary key with SKIP LOCKED (LockIdle), so that a batch never waits for
// a row live traffic holds nor locks a gap its inserts would wait for. A
// key is Whole when the transaction holds every row the scan counted.
func (s *backend) LockIdle(ctx context.Context, tx *sql.Tx, keys []engine.Key, now *time.Time) ([]engine.Held, time.Time, error) {
	refs := make([]driver.KeyRef, len(keys))
	tops := make([]int, len(keys))
	for i, k := range keys {
		refs[i], tops[i] = k.KeyRef, int(k.Top)
	}
	rows, at, err := lockRows(ctx, tx, lockIdleSQL, "lock idle rows", refs, tops)
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]engine.Held, len(keys))
	for i, k := range keys {
		out[i] = engine.Held{KeyRef: k.KeyRef, Rows: rows[i], Whole: int64(len(rows[i])) == k.Rows}
	}
	return out, clockOr(now, at), nil
}
