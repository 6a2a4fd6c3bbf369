-- The statements of idempotent takes (txlimit.Idempotent) on the
-- txlimit_idempotency table (migration 00004). sqlc's MySQL engine does
-- not compile them (UTC_TIMESTAMP(6), an argument that may be NULL). The
-- clock is :now or, when it is NULL, the server's UTC clock.

-- name: ClaimIdempotency
-- Inserts the row of an idempotency key, expiring :window µs after the
-- clock, or takes over one that has expired or holds no result, waiting
-- for the transaction that holds it (a concurrent first call). ON
-- DUPLICATE KEY UPDATE takes an exclusive lock on the row it finds (a
-- plain INSERT's shared lock, upgraded, would deadlock repeats waiting
-- together), and holds it whatever it changes. The assignments read the
-- row as the ones before them left it (or, under MariaDB's
-- SIMULTANEOUS_ASSIGNMENT, as it was): result is cleared before expires_at
-- is judged, so the three change together or not at all. ClaimRead then
-- tells which.
INSERT INTO txlimit_idempotency (id, request, result, expires_at)
VALUES (:id, :request, NULL, TIMESTAMPADD(MICROSECOND, :window, COALESCE(:now, UTC_TIMESTAMP(6))))
ON DUPLICATE KEY UPDATE
    request = IF(result IS NULL OR expires_at <= COALESCE(:now, UTC_TIMESTAMP(6)), VALUES(request), request),
    result = IF(result IS NULL OR expires_at <= COALESCE(:now, UTC_TIMESTAMP(6)), NULL, result),
    expires_at = IF(result IS NULL OR expires_at <= COALESCE(:now, UTC_TIMESTAMP(6)), VALUES(expires_at), expires_at)

-- name: ClaimRead
-- The request and the result ('' for none: the key is the call's) of an
-- idempotency key's row, which ClaimIdempotency holds, by a locking read,
-- which sees the latest committed row under REPEATABLE READ too.
SELECT request, COALESCE(result, '') FROM txlimit_idempotency WHERE id = ? FOR UPDATE

-- name: RecordIdempotency
-- Writes the result of the call that claimed an idempotency key.
UPDATE txlimit_idempotency SET result = :result WHERE id = :id

-- name: DropIdempotency
-- Deletes the row of an idempotency key that the call claimed and that
-- took nothing (a denial): the key is unused again.
DELETE FROM txlimit_idempotency WHERE id = ?

-- name: ExpiredIdempotency
-- Locks up to :max rows that have expired, oldest first, passing over those
-- other transactions hold (SKIP LOCKED): Prune, in a READ COMMITTED
-- transaction, which then deletes them by their ids.
SELECT id FROM txlimit_idempotency FORCE INDEX (txlimit_idempotency_expires_at)
WHERE expires_at <= COALESCE(:now, UTC_TIMESTAMP(6))
ORDER BY expires_at
LIMIT :max
FOR UPDATE SKIP LOCKED

-- name: ProbeIdempotency
-- Reads no row, but fails when the table or one of its columns is missing.
SELECT id, request, result, expires_at FROM txlimit_idempotency LIMIT 0
