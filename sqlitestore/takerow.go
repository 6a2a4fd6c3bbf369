package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
)

// takeRowSQL takes one admitted call from one row in one statement: it
// refills the row (or the full state full_value at full_ts) to the clock
// at, decides and writes as algo.Take does, and returns the new state. It
// returns no row, writing nothing, when the call is not granted, the stored
// value is not finite, or the key has rows beyond shard 0 or a pause
// (paused_until, ended or not): the Go path then decides. Being a write,
// it takes the write lock before it reads the row.
//
// The arithmetic is algo's, operation for operation, on REAL and INTEGER
// microseconds, so that the state written is algo's bit for bit
// (TestTakeRowMatchesAlgo). kind is algo.Kind; eps is algo's relative
// tolerance, bound as a double. A reservation is granted here only when its
// wait is surely below 2e15 µs (63 years); a longer one is left to Go.
//
// sqlc's SQLite grammar rejects it (a CTE before INSERT … SELECT, nested
// derived tables), so it lives here; its first line names it as sqlc does.
const takeRowSQL = `-- name: TakeRow :one
WITH c AS (
    SELECT CAST(:at AS INTEGER) AS at, CAST(:kind AS INTEGER) AS kind, CAST(:rate AS REAL) AS rate,
           CAST(:period AS INTEGER) AS period, CAST(:capacity AS REAL) AS capacity,
           CAST(:max_reserved AS REAL) AS max_reserved, CAST(:count AS REAL) AS count,
           CAST(:reserve AS INTEGER) AS reserve, CAST(:eps AS REAL) AS eps,
           CAST(:full_value AS REAL) AS full_value, CAST(:full_ts AS INTEGER) AS full_ts,
           EXISTS (SELECT 1 FROM txlimit AS x WHERE x.name = :name AND x.key = :key
                   AND (x.shard > 0 OR x.paused_until IS NOT NULL)) AS aside
), s AS (
    SELECT COALESCE(r.value, c.full_value) AS v, COALESCE(r.ts, c.full_ts) AS ts,
           c.at - COALESCE(r.ts, c.full_ts) AS e
    FROM c
    LEFT JOIN txlimit AS r ON r.name = :name AND r.key = :key AND r.shard = :shard
), p AS (
    SELECT s.v AS old_value, s.e,
           CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN min(s.v, c.capacity)
                WHEN c.kind = 2 THEN min(s.v + c.rate * CAST(s.e / c.period AS REAL), c.capacity)
                ELSE min(s.v + CAST(s.e AS REAL) * c.rate / CAST(c.period AS REAL), c.capacity)
           END AS v,
           CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN s.ts
                WHEN c.kind = 2 THEN s.ts + (s.e / c.period) * c.period
                ELSE c.at
           END AS ts
    FROM s, c
), d AS (
    SELECT p.old_value, p.ts, p.e, p.v - c.count AS left_over, p.v - (c.count - c.max_reserved) AS reserve_room,
           c.eps * max(1.0, c.capacity) AS tol
    FROM p, c
)
INSERT INTO txlimit (name, key, shard, value, ts)
SELECT :name, :key, :shard,
       CASE WHEN d.left_over >= -d.tol
            THEN CASE WHEN d.left_over > 0 THEN d.left_over ELSE 0.0 END
            ELSE d.left_over
       END,
       d.ts
FROM d, c
WHERE NOT c.aside AND d.old_value BETWEEN -1e300 AND 1e300
  AND (d.left_over >= -d.tol OR (c.reserve AND (c.max_reserved = 0 OR d.reserve_room >= -d.tol)
       AND (-d.left_over / c.rate + 2) * CAST(c.period AS REAL) + CAST(max(-d.e, 0) AS REAL) < 2e15))
ON CONFLICT (name, key, shard) DO UPDATE SET value = excluded.value, ts = excluded.ts
RETURNING value, ts`

// takeRow takes from an unsharded limit in one statement (takeRowSQL) at
// the clock at. done is false when the statement granted nothing.
func (s *backend) takeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams, at time.Time) (res driver.TakeResult, done bool, err error) {
	c := p.Config
	full := p.Full()
	var next algo.State
	err = s.on(tx).QueryRowContext(ctx, takeRowSQL,
		sql.Named("at", at.UnixMicro()), sql.Named("kind", int64(c.Kind)), sql.Named("rate", c.Rate),
		sql.Named("period", c.Period), sql.Named("capacity", c.Capacity), sql.Named("max_reserved", c.MaxReserved),
		sql.Named("count", p.Count), sql.Named("reserve", p.Reserve), sql.Named("eps", tolerance),
		sql.Named("full_value", full.Value), sql.Named("full_ts", full.TS),
		sql.Named("name", p.Name), sql.Named("key", p.Key), sql.Named("shard", int64(0)),
	).Scan(&next.Value, &next.TS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return driver.TakeResult{}, false, nil
	case err != nil:
		return driver.TakeResult{}, false, wrap(ctx, tx, "take", err)
	}
	return engine.Granted(p, next, at), true, nil
}

// tolerance is algo's relative tolerance (algo.tolerance).
const tolerance = 1e-9
