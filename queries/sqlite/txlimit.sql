-- name: TouchKey :exec
-- A write that changes nothing but takes SQLite's write lock first, so that
-- no other connection can change the rows between our read and our write.
UPDATE txlimit SET value = value WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND 0;

-- name: LockShards :many
SELECT shard, value, ts FROM txlimit
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key)
ORDER BY shard;

-- name: InsertShard :exec
INSERT INTO txlimit (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), sqlc.arg(shard), sqlc.arg(value), sqlc.arg(ts))
ON CONFLICT (name, key, shard) DO NOTHING;

-- name: WriteShard :exec
UPDATE txlimit SET value = sqlc.arg(value), ts = sqlc.arg(ts)
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND shard = sqlc.arg(shard);

-- name: DeleteKey :exec
DELETE FROM txlimit WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);
