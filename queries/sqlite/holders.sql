-- The statements of concurrency limits (txlimit.Concurrency) on the
-- txlimit_holder table (migration 00003): one row per holder of a slot of
-- (name, key), and the key's lock row, whose holder is ''. SQLite has one
-- writer at a time: an acquire's first statement is a write
-- (TouchHolderKey), which takes the database's write lock before the
-- holders are counted, so that no other transaction can insert a holder
-- between the count and the insert. expires_at is microseconds since the
-- Unix epoch, from the store's clock.

-- name: TouchHolderKey :execrows
-- Creates the lock row of (name, key) if it is missing, and takes the write
-- lock either way (SQLite takes it when a write statement starts, whatever
-- it changes). 1 when it created the row, which expires at once: it is the
-- key's until a grant raises it.
INSERT INTO txlimit_holder (name, key, holder, expires_at)
VALUES (sqlc.arg(name), sqlc.arg(key), '', sqlc.arg(now))
ON CONFLICT (name, key, holder) DO NOTHING;

-- name: ReadHolders :many
-- The holders of (name, key), the lock row left out, in order of expiry.
SELECT holder, expires_at FROM txlimit_holder
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder <> ''
ORDER BY expires_at, holder;

-- name: DeleteHolder :execrows
-- Deletes one holder of (name, key): a reclaim, under the write lock.
DELETE FROM txlimit_holder
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = sqlc.arg(holder) AND holder <> '';

-- name: DeleteLiveHolder :execrows
-- Deletes one holder of (name, key) if it is live at now: Release, which
-- then deletes an expired one with DeleteHolder. Both are writes, so that
-- Release never reads before it takes the write lock.
DELETE FROM txlimit_holder
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = sqlc.arg(holder) AND holder <> ''
  AND expires_at > sqlc.arg(now);

-- name: PutHolder :exec
-- Inserts a holder of (name, key), or moves its expiry.
INSERT INTO txlimit_holder (name, key, holder, expires_at)
VALUES (sqlc.arg(name), sqlc.arg(key), sqlc.arg(holder), sqlc.arg(expires_at))
ON CONFLICT (name, key, holder) DO UPDATE SET expires_at = excluded.expires_at;

-- name: ExtendHolder :execrows
-- Moves the expiry of a holder of (name, key) that is live at now.
UPDATE txlimit_holder SET expires_at = sqlc.arg(expires_at)
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = sqlc.arg(holder) AND holder <> ''
  AND expires_at > sqlc.arg(now);

-- name: RaiseLock :exec
-- Raises the expiry of the lock row of (name, key) to a holder's.
UPDATE txlimit_holder SET expires_at = max(expires_at, CAST(sqlc.arg(expires_at) AS INTEGER))
WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = '';

-- name: DropLock :exec
-- Deletes the lock row of (name, key), which the transaction created.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = '';

-- name: DeleteHolders :exec
-- Deletes every holder of (name, key) and its lock row: Reset.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);

-- name: PruneHolders :execrows
-- Deletes up to max_rows rows that have expired at now, holders and lock
-- rows alike.
DELETE FROM txlimit_holder
WHERE (name, key, holder) IN (
    SELECT p.name, p.key, p.holder FROM txlimit_holder AS p
    WHERE p.expires_at <= sqlc.arg(now)
    LIMIT sqlc.arg(max_rows)
);

-- name: ProbeHolders :exec
-- Reads no row, but fails when the table or one of its columns is missing.
SELECT name, key, holder, expires_at FROM txlimit_holder LIMIT 0;
