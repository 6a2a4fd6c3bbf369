-- SQLite has one writer at a time and no row locks: "locking" the rows of a
-- (name, key) means holding the database's write lock, which the transaction
-- then keeps until it ends. Every operation that reads in order to write takes
-- that lock first (TouchKey), so that no other connection can change the rows
-- between the read and the write. ts is microseconds since the Unix epoch.
-- SQLite has no server clock: the store supplies it.

-- name: TouchKey :exec
-- A write that matches no row but still makes the transaction a write
-- transaction: SQLite takes its write lock when a write statement starts,
-- whatever the statement changes. It waits (busy_timeout) or fails with
-- SQLITE_BUSY; it never lets two transactions hold the lock at once.
UPDATE txlimit SET value = value WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND 0;

-- name: LockShards :many
-- The rows of (name, key) in ascending shard order. Run after TouchKey, in
-- the same transaction, so that they are read under the write lock.
SELECT shard, value, prev, ts, paused_until FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key)
ORDER BY shard;

-- name: ReadShards :many
-- The rows of (name, key) as the transaction sees them (its own snapshot),
-- without taking the write lock.
SELECT shard, value, prev, ts, paused_until FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key)
ORDER BY shard;

-- name: InsertShard :execrows
-- Creates one row of (name, key) unless it exists. The store runs it once
-- per shard, in shard order, where PostgreSQL's InsertShards is one
-- statement: sqlc's SQLite engine rejects a recursive CTE, and json_each
-- would make the parameter untyped. Statements are in-process calls here.
INSERT INTO txlimit (name, key, shard, value, prev, ts, paused_until)
VALUES (sqlc.arg(name), sqlc.arg(key), sqlc.arg(shard), sqlc.arg(value), sqlc.arg(prev), sqlc.arg(ts), sqlc.narg(paused_until))
ON CONFLICT (name, key, shard) DO NOTHING;

-- name: WriteShard :exec
-- Stores the new state of one row the transaction holds, and its pause.
UPDATE txlimit SET value = sqlc.arg(value), prev = sqlc.arg(prev), ts = sqlc.arg(ts), paused_until = sqlc.narg(paused_until)
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: DeleteKey :exec
DELETE FROM txlimit WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);

-- name: DeleteShard :execrows
-- Deletes one row; the transaction holds the write lock.
DELETE FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: ScanKeys :many
-- The next (name, key) pairs after a cursor, in primary-key order, for
-- Prune.
SELECT DISTINCT name, key FROM txlimit
WHERE (name, key) > (sqlc.arg(after_name), sqlc.arg(after_key))
ORDER BY name, key
LIMIT sqlc.arg(max_keys);

-- name: RowsBetween :many
-- The rows of the keys from (first_name, first_key) to (last_name,
-- last_key), both included, in primary-key order: the rows of a batch of
-- ScanKeys in one indexed range scan.
SELECT name, key, shard, value, prev, ts, paused_until FROM txlimit
WHERE (name, key) >= (sqlc.arg(first_name), sqlc.arg(first_key))
  AND (name, key) <= (sqlc.arg(last_name), sqlc.arg(last_key))
ORDER BY name, key, shard;

-- name: ProbeTable :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- the check behind Limiter.Ping.
SELECT name, key, shard, value, prev, ts, paused_until FROM txlimit LIMIT 0;
