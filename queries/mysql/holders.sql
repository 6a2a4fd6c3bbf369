-- The statements of concurrency limits (txlimit.Concurrency) on the
-- txlimit_holder table (migration 00002): one row per holder of a slot of
-- (name, key), and the key's lock row, whose holder is '' (the least
-- VARBINARY: holder > '' is every holder of the key and not its lock row).
--
-- Write skew, two acquirers that each count Capacity-1 holders and both
-- insert, is prevented by the lock row: every acquire creates or locks it
-- first (LockHolderKey: INSERT … ON DUPLICATE KEY UPDATE, which locks the
-- row by its primary key and no gap), and then counts the key's holders
-- with a locking read (LockHolders), which reads the latest committed rows
-- under REPEATABLE READ as under READ COMMITTED (InnoDB's consistent reads
-- would read the transaction's snapshot, and InnoDB reports no
-- serialization failure for a row another transaction changed). Under
-- REPEATABLE READ that read also locks the gap after the key's last holder,
-- until the transaction ends. The statements take every instant as an
-- argument: the store reads the server's clock (HolderClock) once it holds
-- the lock row, or takes txlimit.Options.Clock's.

-- name: LockHolderKey :execrows
-- Creates the lock row of (name, key), expired, if it is missing, or locks
-- it, waiting for the transaction that holds it: 1 when it created it (0
-- when the row was there: clientFoundRows is off, as the store requires).
INSERT INTO txlimit_holder (name, `key`, holder, expires_at)
VALUES (sqlc.arg(name), sqlc.arg(key_), '', '1970-01-01 00:00:00')
ON DUPLICATE KEY UPDATE holder = holder;

-- name: LockHolders :many
-- Locks and reads the holders of (name, key), the lock row left out,
-- through the primary key (FORCE INDEX: a locking scan of the table would
-- lock every row it reads).
SELECT h.holder, h.expires_at FROM txlimit_holder AS h FORCE INDEX (PRIMARY)
WHERE h.name = sqlc.arg(name) AND h.`key` = sqlc.arg(key_) AND h.holder > ''
ORDER BY h.holder
FOR UPDATE;

-- name: ReadHolders :many
-- The holders of (name, key) as the transaction sees them, locking
-- nothing: Check's read.
SELECT h.holder, h.expires_at FROM txlimit_holder AS h
WHERE h.name = sqlc.arg(name) AND h.`key` = sqlc.arg(key_) AND h.holder > ''
ORDER BY h.expires_at, h.holder;

-- name: HolderClock :one
-- The server's clock in UTC at microsecond precision (UTC_TIMESTAMP(6),
-- written so that sqlc's catalog knows it; see txlimit.sql's Clock).
SELECT TIMESTAMPADD(MICROSECOND, MICROSECOND(NOW(6)), UTC_TIMESTAMP()) AS clock;

-- name: DeleteHolder :execrows
-- Deletes one holder of (name, key) by its primary key.
DELETE FROM txlimit_holder
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = sqlc.arg(holder) AND holder > '';

-- name: DeleteLiveHolder :execrows
-- Deletes one holder of (name, key) if it is live at now: Release, which
-- then deletes an expired one with DeleteHolder.
DELETE FROM txlimit_holder
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = sqlc.arg(holder) AND holder > ''
  AND expires_at > sqlc.arg(now);

-- name: PutHolder :exec
-- Inserts a holder of (name, key), or moves its expiry.
INSERT INTO txlimit_holder (name, `key`, holder, expires_at)
VALUES (sqlc.arg(name), sqlc.arg(key_), sqlc.arg(holder), sqlc.arg(expires_at))
ON DUPLICATE KEY UPDATE expires_at = sqlc.arg(expires_at);

-- name: ExtendHolder :execrows
-- Moves the expiry of a holder of (name, key) that is live at now.
UPDATE txlimit_holder SET expires_at = sqlc.arg(expires_at)
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = sqlc.arg(holder) AND holder > ''
  AND expires_at > sqlc.arg(now);

-- name: HolderExpiry :many
-- Locks one holder of (name, key) by its primary key and reads its expiry:
-- Extend, when ExtendHolder changed no row (MySQL counts the rows a
-- statement changed, and an expiry moved to where it was is not one).
SELECT expires_at FROM txlimit_holder
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = sqlc.arg(holder) AND holder > ''
FOR UPDATE;

-- name: RaiseLock :exec
-- Raises the expiry of the lock row of (name, key) to a holder's.
UPDATE txlimit_holder SET expires_at = GREATEST(expires_at, CAST(sqlc.arg(expires_at) AS DATETIME(6)))
WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = '';

-- name: DropLock :exec
-- Deletes the lock row of (name, key), which the transaction created.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_) AND holder = '';

-- name: DeleteHolders :exec
-- Deletes every holder of (name, key) and its lock row: Reset. Like
-- txlimit.sql's DeleteKey, it locks by a range, and the gap after it.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND `key` = sqlc.arg(key_);

-- name: ExpiredHolders :many
-- Locks up to max_rows rows that have expired at now, holders and lock rows
-- alike, passing over those other transactions hold (SKIP LOCKED): Prune,
-- in a READ COMMITTED transaction, which keeps no lock on the rows it reads
-- and passes over.
SELECT name, `key`, holder FROM txlimit_holder
WHERE expires_at <= sqlc.arg(now)
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: ProbeHolders :exec
-- Reads no row, but fails when the table or one of its columns is missing.
SELECT name, `key`, holder, expires_at FROM txlimit_holder LIMIT 0;
