-- name: LockShards :many
-- Locks every row of (name, key), waiting, in ascending shard order. The
-- clock is the argument now or, when it is NULL, the server's, read for each
-- row before that row's lock is taken: the store takes the latest reading,
-- and algo never loses or doubles refill for a clock behind a row's time.
SELECT shard, value, ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key)
ORDER BY shard
FOR UPDATE;

-- name: TryLockShard :one
-- Locks the first row of (name, key) that no other transaction holds,
-- without waiting, going up from shard start and then on from shard 0: the
-- index delivers the rows in that order, so the scan stops at the first free
-- one instead of reading and sorting every shard, and the second half runs
-- only when the first found nothing. PostgreSQL never inlines a WITH query
-- that locks rows (FOR UPDATE counts as a side effect), so each half is a CTE
-- scanned on demand without AS MATERIALIZED, which YugabyteDB before 2025.1
-- (PostgreSQL 11) rejects; the plan is the same as with it.
WITH from_start AS (
    SELECT f.shard, f.value, f.ts FROM txlimit AS f
    WHERE f.name = sqlc.arg(name) AND f.key = sqlc.arg(key) AND f.shard >= sqlc.arg(start)::integer
    ORDER BY f.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), below_start AS (
    SELECT b.shard, b.value, b.ts FROM txlimit AS b
    WHERE b.name = sqlc.arg(name) AND b.key = sqlc.arg(key) AND b.shard < sqlc.arg(start)::integer
    ORDER BY b.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
SELECT l.shard, l.value, l.ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock,
       -- The highest shard the key has: rows written under another Shards
       -- (a redeployed config) make the caller reshard on every row.
       CAST(COALESCE((SELECT max(m.shard) FROM txlimit AS m
                      WHERE m.name = sqlc.arg(name) AND m.key = sqlc.arg(key)), -1) AS integer) AS top_shard
FROM (
    SELECT shard, value, ts FROM from_start
    UNION ALL
    SELECT shard, value, ts FROM below_start
    LIMIT 1
) AS l;

-- name: TryLockShardAndRead :many
-- TryLockShard, reading every row of (name, key) in the same statement: one
-- row per shard, each with the locked row (NULL when every row is held or
-- missing), or a single row of NULLs with the clock when the key has none.
-- The locked row is returned as locked: the read of every row sees the
-- statement's snapshot, which a concurrent commit may have overtaken. No AS
-- MATERIALIZED, as in TryLockShard; l, which locks nothing itself, is
-- inlined, over the two locking CTEs that stay scans of their own.
WITH from_start AS (
    SELECT f.shard, f.value, f.ts FROM txlimit AS f
    WHERE f.name = sqlc.arg(name) AND f.key = sqlc.arg(key) AND f.shard >= sqlc.arg(start)::integer
    ORDER BY f.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), below_start AS (
    SELECT b.shard, b.value, b.ts FROM txlimit AS b
    WHERE b.name = sqlc.arg(name) AND b.key = sqlc.arg(key) AND b.shard < sqlc.arg(start)::integer
    ORDER BY b.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), l AS (
    SELECT shard, value, ts FROM from_start
    UNION ALL
    SELECT shard, value, ts FROM below_start
    LIMIT 1
)
SELECT t.shard, t.value, t.ts, c.clock,
       l.shard AS locked_shard, l.value AS locked_value, l.ts AS locked_ts
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN l ON true
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard;

-- name: WaitShard :one
-- Locks one row of (name, key), waiting for the transaction that holds it:
-- the sharded fast path when every shard was busy. top_shard as in
-- TryLockShard.
SELECT w.shard, w.value, w.ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock,
       CAST(COALESCE((SELECT max(m.shard) FROM txlimit AS m
                      WHERE m.name = sqlc.arg(name) AND m.key = sqlc.arg(key)), -1) AS integer) AS top_shard
FROM txlimit AS w
WHERE w.name = sqlc.arg(name) AND w.key = sqlc.arg(key) AND w.shard = sqlc.arg(shard)
FOR UPDATE OF w;

-- name: ReadShards :many
-- Reads the committed rows of (name, key) without locking. The clock comes
-- from a one-row subquery so that it is returned even when there is no row.
SELECT t.shard, t.value, t.ts, c.clock
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard;

-- name: InsertShards :exec
-- Creates the missing rows 0..shards-1 of (name, key) and locks the existing
-- ones, one row after the other in shard order, waiting for rows other
-- transactions hold. DO UPDATE … WHERE false updates nothing but locks the
-- conflicting row (DO NOTHING would pass over it unlocked), so that every
-- lock is taken in ascending order: a transaction never holds a higher shard
-- while it waits for a lower one.
INSERT INTO txlimit (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), s, sqlc.arg(value), sqlc.arg(ts)
FROM generate_series(0, sqlc.arg(shards)::integer - 1) AS s
ORDER BY s
ON CONFLICT (name, key, shard) DO UPDATE SET value = EXCLUDED.value WHERE false;

-- name: WriteShard :exec
-- Stores the new state of one row the transaction holds: the write of an
-- unsharded limit and of the sharded fast path.
UPDATE txlimit SET value = sqlc.arg(value), ts = sqlc.arg(ts)
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: WriteKeyShards :exec
-- Stores the new state of several rows of one (name, key) that the
-- transaction holds. name and key are parameters of their own, not arrays:
-- PostgreSQL then plans an index scan that the cached generic plan keeps,
-- where unnesting them too made it replan at every call.
UPDATE txlimit AS t
SET value = u.value, ts = u.ts
FROM (
    SELECT unnest(sqlc.arg(shards)::integer[]) AS shard,
           unnest(sqlc.arg(vals)::double precision[]) AS value,
           unnest(sqlc.arg(tss)::timestamptz[]) AS ts
) AS u
WHERE t.name = sqlc.arg(name) AND t.key = sqlc.arg(key) AND t.shard = u.shard;

-- name: DeleteKey :exec
-- Deletes every row of (name, key), locking them first in shard order like
-- every other statement that waits for rows of a key.
DELETE FROM txlimit
WHERE (name, key, shard) IN (
    SELECT l.name, l.key, l.shard FROM txlimit AS l
    WHERE l.name = sqlc.arg(name) AND l.key = sqlc.arg(key)
    ORDER BY l.shard
    FOR UPDATE
);

-- name: InsertKeys :many
-- Creates the missing rows 0..shards-1 of several keys and locks the existing
-- ones, one row after the other in the canonical order of LimitAll: name,
-- then key, compared byte by byte (COLLATE "C", as Go compares strings),
-- then shard. It waits for rows other transactions hold, and since every
-- transaction goes through the rows in the same order, none can hold a later
-- row while it waits for an earlier one. Returns the rows it created.
INSERT INTO txlimit (name, key, shard, value, ts)
SELECT k.name, k.key, s.shard, k.value, k.ts
FROM (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(keys)::text[]) AS key,
           unnest(sqlc.arg(shard_counts)::integer[]) AS shards,
           unnest(sqlc.arg(vals)::double precision[]) AS value,
           unnest(sqlc.arg(tss)::timestamptz[]) AS ts
) AS k
CROSS JOIN LATERAL generate_series(0, k.shards - 1) AS s(shard)
ORDER BY k.name COLLATE "C", k.key COLLATE "C", s.shard
ON CONFLICT (name, key, shard) DO UPDATE SET value = EXCLUDED.value WHERE false
RETURNING name, key, shard;

-- name: LockKeys :many
-- Returns every row of several keys, with the clock. InsertKeys has locked
-- rows 0..shards-1 in this transaction (so they do not wait); rows beyond
-- them, left by a config with more shards, come after them in the same
-- canonical order. FOR UPDATE makes a REPEATABLE READ transaction fail with a
-- serialization error rather than read a stale row.
SELECT t.name, t.key, t.shard, t.value, t.ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
JOIN (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(keys)::text[]) AS key
) AS k
    ON t.name = k.name AND t.key = k.key
ORDER BY t.name COLLATE "C", t.key COLLATE "C", t.shard
FOR UPDATE OF t;

-- name: DeleteShards :execrows
-- Deletes the listed rows, which the transaction holds.
DELETE FROM txlimit AS t
USING (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(keys)::text[]) AS key,
           unnest(sqlc.arg(shards)::integer[]) AS shard
) AS u
WHERE t.name = u.name AND t.key = u.key AND t.shard = u.shard;

-- name: ScanKeys :many
-- The next (name, key) pairs after a cursor, in index order, for Prune. It
-- locks nothing.
SELECT DISTINCT name, key FROM txlimit
WHERE (name, key) > (sqlc.arg(after_name)::text, sqlc.arg(after_key)::text)
ORDER BY name, key
LIMIT sqlc.arg(max_keys);

-- name: LockIdle :many
-- Locks the rows of the given keys that no other transaction holds, without
-- waiting (SKIP LOCKED), for Prune, with the number of rows each key has in
-- all, so that Prune can tell whether it holds every row of a key.
SELECT t.name, t.key, t.shard, t.value, t.ts,
       (SELECT count(*) FROM txlimit AS c WHERE c.name = t.name AND c.key = t.key) AS total,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
JOIN (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(keys)::text[]) AS key
) AS k
    ON t.name = k.name AND t.key = k.key
ORDER BY t.name, t.key, t.shard
FOR UPDATE OF t SKIP LOCKED;

-- name: InsertKeyShards :many
-- InsertShards, returning the shards it created: InsertKeys for one key.
-- It, LockIdleKey and DeleteKeyShards serve the stores' SingleKeyStatements
-- option (Citus with txlimit distributed by key, docs/scale-out.md), under
-- which LimitAll and Prune run, key after key, statements that each touch
-- the rows of one (name, key), in place of InsertKeys, LockKeys, LockIdle and
-- DeleteShards, which take arrays of keys. LimitAll then runs InsertKeyShards
-- for every key and LockShards for every key, both in the canonical order,
-- and so takes its locks in the order InsertKeys and LockKeys take them.
INSERT INTO txlimit (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), s, sqlc.arg(value), sqlc.arg(ts)
FROM generate_series(0, sqlc.arg(shards)::integer - 1) AS s
ORDER BY s
ON CONFLICT (name, key, shard) DO UPDATE SET value = EXCLUDED.value WHERE false
RETURNING shard;

-- name: LockIdleKey :many
-- LockIdle for one key.
SELECT t.shard, t.value, t.ts,
       (SELECT count(*) FROM txlimit AS c WHERE c.name = sqlc.arg(name) AND c.key = sqlc.arg(key)) AS total,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
WHERE t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard
FOR UPDATE OF t SKIP LOCKED;

-- name: DeleteKeyShards :execrows
-- DeleteShards for the listed rows of one key, which the transaction holds.
DELETE FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = ANY (sqlc.arg(shards)::integer[]);

-- name: ProbeTable :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- the check behind Limiter.Ping.
SELECT name, key, shard, value, ts FROM txlimit LIMIT 0;

-- name: TakeRow :one
-- One admitted call on one row in one statement: it creates the row or locks
-- it (waiting for the transaction that holds it), refills it to the clock,
-- decides and writes, as algo.Take does, and returns the new state and the
-- clock. It returns no row when the call is not granted, when the stored
-- value is not finite, or when the key has rows beyond shard 0 (written under
-- a sharded config, to be pooled: resharded), all left to the store's Go
-- path; the conflicting row is then locked all the same (ON CONFLICT locks it
-- before its WHERE is evaluated), which the store's locked path that follows
-- takes anyway, and nothing is written.
--
-- The arithmetic is algo's, operation for operation, in float8 and in bigint
-- microseconds (the epoch of a timestamptz is an exact numeric), so that the
-- state written is bit for bit the one algo computes; a differential test in
-- pgstore holds it to algo. The parameters are read once, in c, with the
-- clock. The refill and decision appear three times: for a missing row (full:
-- full_value at full_ts, algo.Full), and in the SET and the WHERE of the row
-- that conflicts, which is the version ON CONFLICT locked, not the
-- statement's snapshot. kind is algo.Kind (1 token bucket, 2 fixed window);
-- tol is algo's tolerance. period must be at most 2^53 µs, so that a
-- remainder of it times an interval is exact. A reservation is granted
-- here only when its wait is surely below 2e15 µs (63 years: a bound from
-- above, in float operations the differential test repeats); a longer one is
-- left to the Go path, which refuses waits a Decision cannot hold. OFFSET 0
-- keeps each step a
-- subquery of its own, evaluated once, where PostgreSQL would otherwise pull
-- it up and repeat its expressions at every use. c is evaluated once without
-- AS MATERIALIZED (which YugabyteDB before 2025.1 rejects): PostgreSQL
-- inlines no WITH query that is referenced more than once or calls a
-- volatile function (clock_timestamp), and c does both.
WITH c AS (
    SELECT k.clock,
           CAST(extract(epoch FROM k.clock) * 1000000 AS bigint) AS now_us,
           sqlc.arg(kind)::integer AS kind,
           sqlc.arg(rate)::float8 AS rate,
           sqlc.arg(period)::bigint AS period,
           sqlc.arg(capacity)::float8 AS capacity,
           sqlc.arg(max_reserved)::float8 AS max_reserved,
           sqlc.arg(count)::float8 AS count,
           sqlc.arg(reserve)::boolean AS reserve,
           1e-9::float8 * greatest(1, sqlc.arg(capacity)::float8) AS tol,
           EXISTS (SELECT 1 FROM txlimit AS x
                   WHERE x.name = sqlc.arg(name) AND x.key = sqlc.arg(key) AND x.shard > 0) AS resharded
    FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS k
)
INSERT INTO txlimit AS t (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), sqlc.arg(shard)::integer, n.value, n.ts
FROM c
CROSS JOIN LATERAL (
    SELECT sqlc.arg(full_value)::float8 AS v, sqlc.arg(full_ts)::timestamptz AS ts,
           c.now_us - CAST(extract(epoch FROM sqlc.arg(full_ts)::timestamptz) * 1000000 AS bigint) AS e
    OFFSET 0
) AS s
CROSS JOIN LATERAL (
    SELECT CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN least(s.v, c.capacity)
                WHEN c.kind = 2 THEN least(s.v + c.rate * CAST(s.e / c.period AS float8), c.capacity)
                ELSE least(s.v + CAST(s.e AS float8) * c.rate / CAST(c.period AS float8), c.capacity)
           END AS v,
           CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN s.ts
                WHEN c.kind = 2 THEN c.clock - (s.e % c.period) * interval '1 microsecond'
                ELSE c.clock
           END AS ts
    OFFSET 0
) AS p
CROSS JOIN LATERAL (
    SELECT p.v - c.count AS left_over, p.v - (c.count - c.max_reserved) AS reserve_room
    OFFSET 0
) AS d
CROSS JOIN LATERAL (
    SELECT CASE WHEN d.left_over >= -c.tol
                THEN CASE WHEN d.left_over > 0 THEN d.left_over ELSE 0 END
                ELSE d.left_over
           END AS value,
           p.ts,
           NOT c.resharded AND s.v BETWEEN -1e300 AND 1e300
           AND (d.left_over >= -c.tol OR (c.reserve AND (c.max_reserved = 0 OR d.reserve_room >= -c.tol)
                    AND (-d.left_over / c.rate + 2) * CAST(c.period AS float8) + CAST(greatest(-s.e, 0) AS float8) < 2e15)) AS ok
) AS n
WHERE n.ok
ON CONFLICT (name, key, shard) DO UPDATE
SET (value, ts) = (
    SELECT n.value, n.ts
    FROM c
    CROSS JOIN LATERAL (
        SELECT t.value AS v, t.ts AS ts,
               c.now_us - CAST(extract(epoch FROM t.ts) * 1000000 AS bigint) AS e
        OFFSET 0
    ) AS s
    CROSS JOIN LATERAL (
        SELECT CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN least(s.v, c.capacity)
                    WHEN c.kind = 2 THEN least(s.v + c.rate * CAST(s.e / c.period AS float8), c.capacity)
                    ELSE least(s.v + CAST(s.e AS float8) * c.rate / CAST(c.period AS float8), c.capacity)
               END AS v,
               CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN s.ts
                    WHEN c.kind = 2 THEN c.clock - (s.e % c.period) * interval '1 microsecond'
                    ELSE c.clock
               END AS ts
        OFFSET 0
    ) AS p
    CROSS JOIN LATERAL (
        SELECT p.v - c.count AS left_over, p.v - (c.count - c.max_reserved) AS reserve_room
        OFFSET 0
    ) AS d
    CROSS JOIN LATERAL (
        SELECT CASE WHEN d.left_over >= -c.tol
                    THEN CASE WHEN d.left_over > 0 THEN d.left_over ELSE 0 END
                    ELSE d.left_over
               END AS value,
               p.ts,
               NOT c.resharded AND s.v BETWEEN -1e300 AND 1e300
               AND (d.left_over >= -c.tol OR (c.reserve AND (c.max_reserved = 0 OR d.reserve_room >= -c.tol)
                    AND (-d.left_over / c.rate + 2) * CAST(c.period AS float8) + CAST(greatest(-s.e, 0) AS float8) < 2e15)) AS ok
    ) AS n
)
WHERE (
    SELECT n.ok
    FROM c
    CROSS JOIN LATERAL (
        SELECT t.value AS v, t.ts AS ts,
               c.now_us - CAST(extract(epoch FROM t.ts) * 1000000 AS bigint) AS e
        OFFSET 0
    ) AS s
    CROSS JOIN LATERAL (
        SELECT CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN least(s.v, c.capacity)
                    WHEN c.kind = 2 THEN least(s.v + c.rate * CAST(s.e / c.period AS float8), c.capacity)
                    ELSE least(s.v + CAST(s.e AS float8) * c.rate / CAST(c.period AS float8), c.capacity)
               END AS v,
               CASE WHEN s.e <= 0 OR (c.kind = 2 AND s.e < c.period) THEN s.ts
                    WHEN c.kind = 2 THEN c.clock - (s.e % c.period) * interval '1 microsecond'
                    ELSE c.clock
               END AS ts
        OFFSET 0
    ) AS p
    CROSS JOIN LATERAL (
        SELECT p.v - c.count AS left_over, p.v - (c.count - c.max_reserved) AS reserve_room
        OFFSET 0
    ) AS d
    CROSS JOIN LATERAL (
        SELECT CASE WHEN d.left_over >= -c.tol
                    THEN CASE WHEN d.left_over > 0 THEN d.left_over ELSE 0 END
                    ELSE d.left_over
               END AS value,
               p.ts,
               NOT c.resharded AND s.v BETWEEN -1e300 AND 1e300
               AND (d.left_over >= -c.tol OR (c.reserve AND (c.max_reserved = 0 OR d.reserve_room >= -c.tol)
                    AND (-d.left_over / c.rate + 2) * CAST(c.period AS float8) + CAST(greatest(-s.e, 0) AS float8) < 2e15)) AS ok
    ) AS n
)
RETURNING t.value, t.ts, (SELECT c.clock FROM c) AS clock;

-- name: TakeBucket :one
-- TakeRow for the common case, lean: one token bucket call that is not a
-- reservation. TakeRow's steps are subqueries that PostgreSQL sets up anew
-- at every execution, three times over (for a missing row, in the SET and in
-- the WHERE), which made it cost the server three times the hand-written
-- SELECT … FOR UPDATE plus UPDATE (instructions counted under callgrind);
-- this statement has no subquery but the test for shards beyond 0, and its
-- expressions are small enough to repeat. The clock is statement_timestamp(),
-- the server's time at the call like clock_timestamp() but stable within the
-- statement, so that every use reads the same instant.
--
-- A missing row is full (Capacity at ts 0, algo.Full): refilled it stays
-- Capacity, so taking count leaves Capacity - count, stamped now (or at 0,
-- the row's own time, for a clock before 1970). The INSERT proposes that
-- row only when the key has no rows beyond shard 0 (a sharded config's, to
-- be resharded by the Go path): with no row proposed there is no conflict,
-- so the ON CONFLICT branch need not look again. On a conflict the row is locked (waiting for
-- its holder) and its latest version refilled and decided as algo.Take
-- does: elapsed e in microseconds, e <= 0 adds nothing (v + 0 is v), the
-- value capped at Capacity, what is left floored at 0 (greatest(0, x) keeps
-- +0 where x is -0, as algo's x > 0 test does), the time the later of the
-- row's and the clock. No row comes back when the call does not fit or the
-- stored value is not finite; the store then takes its locked path.
INSERT INTO txlimit AS t (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), 0,
       greatest(0, sqlc.arg(capacity)::float8 - sqlc.arg(count)::float8),
       greatest(timestamptz 'epoch', COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()))
WHERE sqlc.arg(capacity)::float8 - sqlc.arg(count)::float8 >= -1e-9::float8 * greatest(1, sqlc.arg(capacity)::float8)
  AND NOT EXISTS (SELECT 1 FROM txlimit AS x
                  WHERE x.name = sqlc.arg(name) AND x.key = sqlc.arg(key) AND x.shard > 0)
ON CONFLICT (name, key, shard) DO UPDATE
SET value = greatest(0,
        least(t.value + CAST(greatest(CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint), 0) AS float8)
                        * sqlc.arg(rate)::float8 / CAST(sqlc.arg(period)::bigint AS float8),
              sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
    ts = greatest(t.ts, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()))
WHERE t.value BETWEEN -1e300 AND 1e300
  AND least(t.value + CAST(greatest(CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint), 0) AS float8)
                      * sqlc.arg(rate)::float8 / CAST(sqlc.arg(period)::bigint AS float8),
            sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8
      >= -1e-9::float8 * greatest(1, sqlc.arg(capacity)::float8)
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;

-- name: TakeWindow :one
-- TakeBucket for a fixed window: one call that is not a reservation, in a
-- statement as lean. A missing row is full at full_ts (algo.Full: the
-- window origin); either row is advanced by whole periods: w = e / period
-- windows refill rate each (w = 0 for e < period, where v + 0 is v), and
-- the time moves to the start of the current window, clock - e % period,
-- only when a window has passed.
INSERT INTO txlimit AS t (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), 0,
       greatest(0, sqlc.arg(capacity)::float8 - sqlc.arg(count)::float8),
       CASE WHEN f.e < sqlc.arg(period)::bigint THEN sqlc.arg(full_ts)::timestamptz
            ELSE f.clock - (f.e % sqlc.arg(period)::bigint) * interval '1 microsecond'
       END
FROM (SELECT k.clock, CAST(extract(epoch FROM k.clock - sqlc.arg(full_ts)::timestamptz) * 1000000 AS bigint) AS e
      FROM (SELECT COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS clock) AS k) AS f
WHERE sqlc.arg(capacity)::float8 - sqlc.arg(count)::float8 >= -1e-9::float8 * greatest(1, sqlc.arg(capacity)::float8)
  AND NOT EXISTS (SELECT 1 FROM txlimit AS x
                  WHERE x.name = sqlc.arg(name) AND x.key = sqlc.arg(key) AND x.shard > 0)
ON CONFLICT (name, key, shard) DO UPDATE
SET value = greatest(0,
        least(t.value + sqlc.arg(rate)::float8 * CAST(greatest(CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint), 0) / sqlc.arg(period)::bigint AS float8),
              sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
    ts = CASE WHEN CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint) < sqlc.arg(period)::bigint THEN t.ts
              ELSE COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp())
                   - (CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint) % sqlc.arg(period)::bigint) * interval '1 microsecond'
         END
WHERE t.value BETWEEN -1e300 AND 1e300
  AND least(t.value + sqlc.arg(rate)::float8 * CAST(greatest(CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint), 0) / sqlc.arg(period)::bigint AS float8),
            sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8
      >= -1e-9::float8 * greatest(1, sqlc.arg(capacity)::float8)
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;
