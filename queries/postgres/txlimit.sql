-- name: LockShards :many
-- Locks every row of (name, key), waiting, in ascending shard order. The
-- clock is the argument now or, when it is NULL, the server's.
SELECT shard, value, ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key)
ORDER BY shard
FOR UPDATE;

-- name: TryLockShard :one
-- Locks the first row of (name, key) in the order given that no other
-- transaction holds, without waiting.
SELECT shard, value, ts,
       CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = ANY(sqlc.arg(shards)::integer[])
ORDER BY array_position(sqlc.arg(shards)::integer[], shard)
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: ReadShards :many
-- Reads the committed rows of (name, key) without locking. The clock comes
-- from a one-row subquery so that it is returned even when there is no row.
SELECT t.shard, t.value, t.ts, c.clock
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key)
ORDER BY t.shard;

-- name: InsertShards :exec
-- Creates the missing rows 0..shards-1 of (name, key) in shard order.
INSERT INTO txlimit (name, key, shard, value, ts)
SELECT sqlc.arg(name), sqlc.arg(key), s, sqlc.arg(value), sqlc.arg(ts)
FROM generate_series(0, sqlc.arg(shards)::integer - 1) AS s
ORDER BY s
ON CONFLICT (name, key, shard) DO NOTHING;

-- name: WriteShards :exec
-- Stores the new state of rows the transaction holds.
UPDATE txlimit AS t
SET value = u.value, ts = u.ts
FROM (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(keys)::text[]) AS key,
           unnest(sqlc.arg(shards)::integer[]) AS shard,
           unnest(sqlc.arg(vals)::double precision[]) AS value,
           unnest(sqlc.arg(tss)::timestamptz[]) AS ts
) AS u
WHERE t.name = u.name AND t.key = u.key AND t.shard = u.shard;

-- name: DeleteKey :exec
DELETE FROM txlimit WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);
