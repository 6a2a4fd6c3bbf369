-- The statements of mysqlstore that sqlc's MySQL engine compiles. The
-- statements it cannot (JSON_TABLE, user variables, UTC_TIMESTAMP(6), SHOW)
-- are in mysqlstore/internal/rawsql/*.sql, read by name the same way.
--
-- InnoDB under REPEATABLE READ (MySQL's default) locks the gap before a row
-- that a locking read or an UPDATE looks for and does not find, and the gap
-- after a range that it scans; two transactions that both hold a gap and
-- both insert into it deadlock. So no statement here takes a lock by a range
-- or on a row that may be missing: rows are created by the store's INSERT …
-- ON DUPLICATE KEY UPDATE (which locks the row it finds or creates, and no
-- gap) and then locked by their whole primary key (shard IN (…)), through
-- the primary key (FORCE INDEX: on a small table the optimizer would
-- otherwise scan it, and a locking scan locks every row it reads). The
-- exceptions are named at the statement.
--
-- The clock is the server's UTC time at microsecond precision,
-- UTC_TIMESTAMP(6), which sqlc's catalog knows only without its precision
-- argument; it is written here as TIMESTAMPADD(MICROSECOND,
-- MICROSECOND(NOW(6)), UTC_TIMESTAMP()), the same instant: both functions
-- read the statement's start time, UTC_TIMESTAMP() truncated to the second,
-- and a time zone offset is a whole number of minutes. NOW(6) alone is in
-- the session's time_zone, which can step back an hour when daylight saving
-- time ends.

-- name: ReadShards :many
-- Every row of (name, key) as the transaction sees them (its snapshot, and
-- its own writes), locking nothing: Check, and the engine before it locks.
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until FROM txlimit AS t
WHERE t.name = sqlc.arg(name) AND t.`key` = sqlc.arg(key_)
ORDER BY t.shard;

-- name: Clock :one
-- The server's clock, for the reads that lock nothing.
SELECT TIMESTAMPADD(MICROSECOND, MICROSECOND(NOW(6)), UTC_TIMESTAMP()) AS clock;

-- name: LockShards :many
-- Locks the listed shards of (name, key), which exist (the store created
-- them first), waiting for the transactions that hold them, in ascending
-- shard order. The clock is the statement's start, when the store already
-- holds those rows (it created or locked them in the statement before), so
-- that the transactions that lock a limit read the clock in the order they
-- hold it. top is the highest shard of the key as the transaction's
-- snapshot has it: a locking read clause does not reach into a subquery, so
-- it locks nothing (rows beyond the config's Shards, left by another
-- config, which the store then locks too).
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until,
       TIMESTAMPADD(MICROSECOND, MICROSECOND(NOW(6)), UTC_TIMESTAMP()) AS clock,
       CAST(COALESCE((SELECT MAX(m.shard) FROM txlimit AS m
                      WHERE m.name = sqlc.arg(name) AND m.`key` = sqlc.arg(key_)), -1) AS SIGNED) AS top
FROM txlimit AS t FORCE INDEX (PRIMARY)
WHERE t.name = sqlc.arg(name) AND t.`key` = sqlc.arg(key_) AND t.shard IN (sqlc.slice(shards))
ORDER BY t.shard
FOR UPDATE;

-- name: TryLockShard :one
-- Locks one shard of (name, key) unless another transaction holds it
-- (SKIP LOCKED: no row then), for the sharded fast path, which chose a
-- shard that its snapshot says exists.
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until, TIMESTAMPADD(MICROSECOND, MICROSECOND(NOW(6)), UTC_TIMESTAMP()) AS clock
FROM txlimit AS t FORCE INDEX (PRIMARY)
WHERE t.name = sqlc.arg(name) AND t.`key` = sqlc.arg(key_) AND t.shard = sqlc.arg(shard)
FOR UPDATE SKIP LOCKED;

-- name: TryLockShards :many
-- TryLockShard for several shards at once: the ones no other transaction
-- holds.
SELECT t.shard, t.value, t.prev, t.ts, t.paused_until
FROM txlimit AS t FORCE INDEX (PRIMARY)
WHERE t.name = sqlc.arg(name) AND t.`key` = sqlc.arg(key_) AND t.shard IN (sqlc.slice(shards))
ORDER BY t.shard
FOR UPDATE SKIP LOCKED;

-- name: WriteShard :exec
-- Stores the new state of one row the transaction holds, and its pause.
UPDATE txlimit SET value = sqlc.arg(value), prev = sqlc.arg(prev), ts = sqlc.arg(ts), paused_until = sqlc.narg(paused_until)
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND shard = sqlc.arg(shard);

-- name: DeleteShards :execrows
-- Deletes the listed rows of (name, key), which the transaction holds.
DELETE FROM txlimit
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND shard IN (sqlc.slice(shards));

-- name: DeleteKey :exec
-- Deletes every row of (name, key): Reset. The one statement here that
-- locks by a range (it must see rows the snapshot may not have): besides the
-- key's rows, the gap after them, so that a key first used meanwhile that
-- sorts right after this one waits for the transaction to end.
DELETE FROM txlimit WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_);

-- name: ScanKeys :many
-- The next (name, key) pairs after a cursor, in primary-key order (bytes),
-- with how many rows each has and its highest shard, for Prune. A
-- consistent read: it locks nothing.
SELECT t.name, t.`key`, COUNT(*) AS total, CAST(MAX(t.shard) AS SIGNED) AS top FROM txlimit AS t
WHERE t.name > sqlc.arg(after_name) OR (t.name = sqlc.arg(after_name) AND t.`key` > sqlc.arg(after_key))
GROUP BY t.name, t.`key`
ORDER BY t.name, t.`key`
LIMIT ?;

-- name: ProbeTable :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- the check behind Limiter.Ping.
SELECT name, `key`, shard, value, prev, ts, paused_until FROM txlimit LIMIT 0;

-- name: Version :one
-- The server's version: Ping's check of what it is, and the store's of
-- whether it is MariaDB, whose INSERT … RETURNING saves the one-statement
-- take its second round trip.
SELECT VERSION();

-- name: ProbeFoundRows :execrows
-- Ping's probe of clientFoundRows=true, run twice in a transaction it rolls
-- back: the second run changes nothing, which counts 0 affected rows by
-- default and 1 with it. No limit can have its row (the name is empty).
INSERT INTO txlimit (name, `key`, shard, value, ts) VALUES ('', 'txlimit ping', 0, 0, '1970-01-01')
ON DUPLICATE KEY UPDATE value = value;

-- name: Echo :one
-- A query with an argument, which the driver prepares on the server unless
-- it interpolates: Ping's probe of interpolateParams.
SELECT CAST(sqlc.arg(one) AS SIGNED) AS one;

