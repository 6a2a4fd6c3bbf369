-- The statements of pgstore and pgsqlstore, which both run the code sqlc
-- generates from this directory (internal/pgdb). Array parameters travel as
-- text, in PostgreSQL's array-literal syntax (pgproto.Array builds them), and
-- are cast to the array type on the server: database/sql has no array type,
-- and sqlc's database/sql code would wrap them in lib/pq's pq.Array, making
-- pgsqlstore import a driver.

-- name: LockShards :many
-- Locks every row of (name, key), waiting, in ascending shard order. The
-- clock is the argument now or, when it is NULL, the server's, read for each
-- row before that row's lock is taken: the store takes the latest reading,
-- and algo never loses or doubles refill for a clock behind a row's time.
SELECT shard, value, prev, ts, paused_until,
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
    SELECT f.shard, f.value, f.prev, f.ts, f.shards, f.paused_until FROM txlimit AS f
    WHERE f.name = sqlc.arg(name) AND f.key = sqlc.arg(key) AND f.shard >= sqlc.arg(start)::integer
    ORDER BY f.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), below_start AS (
    SELECT b.shard, b.value, b.prev, b.ts, b.shards, b.paused_until FROM txlimit AS b
    WHERE b.name = sqlc.arg(name) AND b.key = sqlc.arg(key) AND b.shard < sqlc.arg(start)::integer
    ORDER BY b.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
SELECT l.shard, l.value, l.prev, l.ts, l.paused_until,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock,
       -- The highest shard of the locked row's layout (shards, migration
       -- 00009): rows written under another Shards (a redeployed config)
       -- make the caller reshard on every row.
       l.shards - 1 AS top_shard
FROM (
    SELECT shard, value, prev, ts, shards, paused_until FROM from_start
    UNION ALL
    SELECT shard, value, prev, ts, shards, paused_until FROM below_start
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
    SELECT f.shard, f.value, f.prev, f.ts, f.paused_until FROM txlimit AS f
    WHERE f.name = sqlc.arg(name) AND f.key = sqlc.arg(key) AND f.shard >= sqlc.arg(start)::integer
    ORDER BY f.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), below_start AS (
    SELECT b.shard, b.value, b.prev, b.ts, b.paused_until FROM txlimit AS b
    WHERE b.name = sqlc.arg(name) AND b.key = sqlc.arg(key) AND b.shard < sqlc.arg(start)::integer
    ORDER BY b.shard
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), l AS (
    SELECT shard, value, prev, ts, paused_until FROM from_start
    UNION ALL
    SELECT shard, value, prev, ts, paused_until FROM below_start
    LIMIT 1
)
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until, c.clock,
       l.shard AS locked_shard, l.value AS locked_value, l.prev AS locked_prev, l.ts AS locked_ts,
       l.paused_until AS locked_paused_until
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN l ON true
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard;

-- name: WaitShard :one
-- Locks one row of (name, key), waiting for the transaction that holds it:
-- the sharded fast path when every shard was busy. top_shard as in
-- TryLockShard.
SELECT w.shard, w.value, w.prev, w.ts, w.paused_until,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock,
       w.shards - 1 AS top_shard
FROM txlimit AS w
WHERE w.name = sqlc.arg(name) AND w.key = sqlc.arg(key) AND w.shard = sqlc.arg(shard)
FOR UPDATE OF w;

-- name: ReadShards :many
-- Reads the committed rows of (name, key) without locking. The clock comes
-- from a one-row subquery so that it is returned even when there is no row.
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until, c.clock
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard;

-- name: InsertShards :exec
-- Creates the missing rows 0..shards-1 of (name, key) and locks the existing
-- ones, one row after the other in shard order, waiting for rows other
-- transactions hold. DO UPDATE … WHERE false updates nothing but locks the
-- conflicting row (DO NOTHING would pass over it unlocked), so that every
-- lock is taken in ascending order: a transaction never holds a higher shard
-- while it waits for a lower one. The rows are created with the number of
-- shards of their layout (shards, migration 00009).
INSERT INTO txlimit (name, key, shard, value, ts, shards)
SELECT sqlc.arg(name), sqlc.arg(key), s, sqlc.arg(value), sqlc.arg(ts), sqlc.arg(shards)::integer
FROM generate_series(0, sqlc.arg(shards)::integer - 1) AS s
ORDER BY s
ON CONFLICT (name, key, shard) DO UPDATE SET value = EXCLUDED.value WHERE false;

-- name: WriteShard :exec
-- Stores the new state of one row the transaction holds, the only row of
-- an unsharded limit: the rows beyond it, if any, are deleted in the same
-- transaction, so the layout is of one shard (shards, migration 00009) and
-- the next call can take in one statement again.
UPDATE txlimit SET value = sqlc.arg(value), prev = sqlc.arg(prev), ts = sqlc.arg(ts), shards = 1,
                   paused_until = sqlc.narg(paused_until)::timestamptz
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: WriteFastShard :exec
-- Stores the new state of one row the transaction holds: the write of the
-- sharded fast path, which takes from one shard of its layout.
UPDATE txlimit SET value = sqlc.arg(value), prev = sqlc.arg(prev), ts = sqlc.arg(ts)
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: WriteKeyShards :exec
-- Stores the new state of several rows of one (name, key) that the
-- transaction holds. name and key are parameters of their own, not arrays:
-- PostgreSQL then plans an index scan that the cached generic plan keeps,
-- where unnesting them too made it replan at every call. The rows are those
-- of the layout, 0 to the number of shards - 1 (shards, migration 00009).
UPDATE txlimit AS t
SET value = u.value, prev = u.prev, ts = u.ts, shards = cardinality(sqlc.arg(shards)::text::integer[]),
    paused_until = sqlc.narg(paused_until)::timestamptz
FROM (
    SELECT unnest(sqlc.arg(shards)::text::integer[]) AS shard,
           unnest(sqlc.arg(vals)::text::double precision[]) AS value,
           unnest(sqlc.arg(prevs)::text::double precision[]) AS prev,
           unnest(sqlc.arg(tss)::text::timestamptz[]) AS ts
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
-- row while it waits for an earlier one. Returns the rows it created, each
-- with the number of shards of its layout (shards, migration 00009).
INSERT INTO txlimit (name, key, shard, value, ts, shards)
SELECT k.name, k.key, s.shard, k.value, k.ts, k.shards
FROM (
    SELECT unnest(sqlc.arg(names)::text::text[]) AS name,
           unnest(sqlc.arg(keys)::text::text[]) AS key,
           unnest(sqlc.arg(shard_counts)::text::integer[]) AS shards,
           unnest(sqlc.arg(vals)::text::double precision[]) AS value,
           unnest(sqlc.arg(tss)::text::timestamptz[]) AS ts
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
SELECT t.name, t.key, t.shard, t.value, t.prev, t.ts, t.paused_until,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
JOIN (
    SELECT unnest(sqlc.arg(names)::text::text[]) AS name,
           unnest(sqlc.arg(keys)::text::text[]) AS key
) AS k
    ON t.name = k.name AND t.key = k.key
ORDER BY t.name COLLATE "C", t.key COLLATE "C", t.shard
FOR UPDATE OF t;

-- name: DeleteShards :execrows
-- Deletes the listed rows, which the transaction holds.
DELETE FROM txlimit AS t
USING (
    SELECT unnest(sqlc.arg(names)::text::text[]) AS name,
           unnest(sqlc.arg(keys)::text::text[]) AS key,
           unnest(sqlc.arg(shards)::text::integer[]) AS shard
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
SELECT t.name, t.key, t.shard, t.value, t.prev, t.ts, t.paused_until,
       (SELECT count(*) FROM txlimit AS c WHERE c.name = t.name AND c.key = t.key) AS total,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
JOIN (
    SELECT unnest(sqlc.arg(names)::text::text[]) AS name,
           unnest(sqlc.arg(keys)::text::text[]) AS key
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
INSERT INTO txlimit (name, key, shard, value, ts, shards)
SELECT sqlc.arg(name), sqlc.arg(key), s, sqlc.arg(value), sqlc.arg(ts), sqlc.arg(shards)::integer
FROM generate_series(0, sqlc.arg(shards)::integer - 1) AS s
ORDER BY s
ON CONFLICT (name, key, shard) DO UPDATE SET value = EXCLUDED.value WHERE false
RETURNING shard;

-- name: LockIdleKey :many
-- LockIdle for one key.
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until,
       (SELECT count(*) FROM txlimit AS c WHERE c.name = sqlc.arg(name) AND c.key = sqlc.arg(key)) AS total,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit AS t
WHERE t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard
FOR UPDATE OF t SKIP LOCKED;

-- name: DeleteKeyShards :execrows
-- DeleteShards for the listed rows of one key, which the transaction holds.
DELETE FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = ANY (sqlc.arg(shards)::text::integer[]);

-- name: ProbeTable :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- the check behind Limiter.Ping.
SELECT name, key, shard, value, prev, ts, shards, paused_until FROM txlimit LIMIT 0;

-- name: TakeBucket :one
-- One admitted call of a token bucket that is not a reservation, in one
-- statement: it creates the key's row or locks it (waiting for the
-- transaction that holds it), refills it to the clock, decides and writes,
-- with the functions of migrations 00003 and 00009 (algo's arithmetic,
-- operation for operation: TestTakeRowMatchesAlgo holds the rows it writes
-- to algo). It returns the new state and the clock, or no row when the call
-- is not granted, when the stored value is not finite, or when the key's
-- rows are a sharded layout (shards, migration 00009: rows beyond shard 0,
-- written under a sharded config, to be pooled); all of those are left to
-- the store's Go path, and nothing is written. The conflicting row is then
-- locked all the same (ON CONFLICT locks it before its WHERE is evaluated),
-- which that locked path takes anyway.
--
-- A missing row is full (algo.Full): what a take leaves of it does not
-- depend on the clock, so the store computes it with algo (fresh_value)
-- and the statement only stamps it. The store sends the statement only
-- when that row grants (driver.Fresh): no row of the key holds more than a
-- full one, so a call a full row refuses is refused whatever the row. The
-- row is proposed unconditionally, and on a conflict the latest version of
-- the row (the one ON CONFLICT locked, not the statement's snapshot) is
-- refilled and decided. A key with no shard 0 has no row at all (the rows
-- of a layout are created 0 to Shards-1 together), so the insertion needs
-- no test of its own.
--
-- A take sent in one pipeline with the caller's COMMIT (Limiter.CommitTx)
-- runs the statement with each /*must*/ replaced by OR txlimit_deny()
-- (internal/pgproto), so that every case that would return no row raises
-- instead (SQLSTATE TXL01) and the server skips the COMMIT queued after
-- it. The plain statement does not name the function: a call of a PL/pgSQL
-- function in a plan costs its every execution, called or not. So does
-- every operation the statement names: PostgreSQL builds its expressions
-- anew at each execution (BenchmarkServerInstructions counts them), which
-- is why it takes the period as a float8, tests only the upper bound of the
-- stored value (a value below -1e300, or -Inf, refills to no grant without
-- overflowing), reads the clock of the refill from the proposed row, and
-- decides by comparing the refilled value, before the cap, with fits_at:
-- the least value for which algo's test (the capped value minus the count,
-- within algo's tolerance) grants, which the store finds in Go
-- (pgproto.leastGranting; every operation of that test rounds
-- monotonically, so the comparison decides as the test does).
--
-- The clock is statement_timestamp(), the server's time at the call, stable
-- within the statement so that every use reads the same instant, or the
-- injected now. The proposed row's ts is the later of the clock and
-- full_ts, which for a token bucket is the epoch, so EXCLUDED.ts is the
-- server's clock (after 1970) where now is NULL. The elapsed time is
-- written out where it is used rather than computed once in a subquery:
-- PostgreSQL sets a subquery up anew at every execution, which costs more
-- than repeating the few operations. period must be at most 2^53 µs and
-- every magnitude at most 1e200 (driver.InSQL).
INSERT INTO txlimit AS t (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
        txlimit_bucket_ts(sqlc.arg(full_ts)::timestamptz, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp())))
ON CONFLICT (name, key, shard) DO UPDATE
SET value = txlimit_kept(least(t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8),
                               sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
    ts = txlimit_bucket_ts(t.ts, COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts))
WHERE (t.shards = 1 AND t.paused_until IS NULL AND t.value <= 1e300
       AND t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8) >= sqlc.arg(fits_at)::float8) /*must*/
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;

-- name: TakeWindow :one
-- TakeBucket for a fixed window, with the window's functions: the row's
-- time moves to the start of the window the clock is in, and the clock is
-- read where it is used (the proposed row's ts is the start of its window,
-- not the clock).
INSERT INTO txlimit AS t (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
        txlimit_window_start(sqlc.arg(full_ts)::timestamptz,
                             txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), sqlc.arg(full_ts)::timestamptz),
                             sqlc.arg(period)::bigint))
ON CONFLICT (name, key, shard) DO UPDATE
SET value = txlimit_kept(least(t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint),
                               sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
    ts = txlimit_window_start(t.ts, txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts),
                              sqlc.arg(period)::bigint)
WHERE (t.shards = 1 AND t.paused_until IS NULL AND t.value <= 1e300
       AND t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint) >= sqlc.arg(fits_at)::float8) /*must*/
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;

-- name: TakeBucketReserve :one
-- TakeBucket for a reservation: the call fits, or it is granted as a debt
-- within max_reserved (0: no cap) whose wait is surely below 2e15 µs
-- (txlimit_wait_short; a longer one is left to the Go path, which refuses
-- waits a Decision cannot hold). debt_at is fits_at for the debt's test
-- (-Infinity without a cap); a call that fits keeps no debt (the value is
-- floored at 0), one that does not keeps its debt. It tests both bounds of
-- the stored value: a debt's wait divides by the rate, which could
-- overflow.
INSERT INTO txlimit AS t (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
        txlimit_bucket_ts(sqlc.arg(full_ts)::timestamptz, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp())))
ON CONFLICT (name, key, shard) DO UPDATE
SET value = greatest(least(t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8),
                          sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
                    CASE WHEN t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8) >= sqlc.arg(fits_at)::float8
                         THEN 0 ELSE CAST('-Infinity' AS float8) END),
    ts = txlimit_bucket_ts(t.ts, COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts))
WHERE (t.shards = 1 AND t.paused_until IS NULL AND t.value BETWEEN -1e300 AND 1e300
       AND t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8) >= sqlc.arg(debt_at)::float8
       AND (t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8) >= sqlc.arg(fits_at)::float8
            OR txlimit_wait_short(least(t.value + txlimit_bucket_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::float8),
                                             sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
                                       sqlc.arg(rate)::float8, sqlc.arg(period)::float8,
                                       txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, EXCLUDED.ts), t.ts)))) /*must*/
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;

-- name: TakeWindowReserve :one
-- TakeBucketReserve for a fixed window.
INSERT INTO txlimit AS t (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
        txlimit_window_start(sqlc.arg(full_ts)::timestamptz,
                             txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), sqlc.arg(full_ts)::timestamptz),
                             sqlc.arg(period)::bigint))
ON CONFLICT (name, key, shard) DO UPDATE
SET value = greatest(least(t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint),
                          sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
                    CASE WHEN t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint) >= sqlc.arg(fits_at)::float8
                         THEN 0 ELSE CAST('-Infinity' AS float8) END),
    ts = txlimit_window_start(t.ts, txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts),
                              sqlc.arg(period)::bigint)
WHERE (t.shards = 1 AND t.paused_until IS NULL AND t.value BETWEEN -1e300 AND 1e300
       AND t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint) >= sqlc.arg(debt_at)::float8
       AND (t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint) >= sqlc.arg(fits_at)::float8
            OR txlimit_wait_bounded(least(t.value + txlimit_window_gain(txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts), sqlc.arg(rate)::float8, sqlc.arg(period)::bigint),
                                               sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
                                         sqlc.arg(rate)::float8, sqlc.arg(period)::bigint,
                                         txlimit_elapsed(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()), t.ts)))) /*must*/
RETURNING t.value, t.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock;

-- name: Deny :exec
-- Raises txlimit_deny's SQLSTATE TXL01: what a take at commit sends in
-- place of the take when the call would not be granted even on a full row,
-- so that the server skips the COMMIT queued after it.
SELECT txlimit_deny();
