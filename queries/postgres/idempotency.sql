-- The statements of idempotent takes (txlimit.Idempotent) on the
-- txlimit_idempotency table (migration 00012): one row per idempotency
-- key, with the request it was first used for, that call's result (NULL
-- until the call records it) and the instant it expires. Every statement
-- touches one key's row, so they suit a table distributed by it as they
-- are. The clock is the argument now or, when it is NULL, the server's
-- clock_timestamp().

-- name: ClaimIdempotency :execrows
-- Inserts the row of an idempotency key, expiring window_us (µs) after the
-- clock, or takes over one that has expired or holds no result, waiting for
-- the transaction that holds it (a concurrent first call): 1 when it did.
-- 0 when the row is another call's, which it then holds: DO UPDATE … WHERE
-- locks the conflicting row whatever the condition says, and a row
-- deleted meanwhile (the first call rolled back) makes the insertion go
-- ahead. Under REPEATABLE READ and SERIALIZABLE, a row that a transaction
-- committed after this one's snapshot is a serialization failure.
INSERT INTO txlimit_idempotency AS t (id, request, result, expires_at)
SELECT sqlc.arg(id), sqlc.arg(request), NULL, c.clock + sqlc.arg(window_us)::bigint * interval '1 microsecond'
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
ON CONFLICT (id) DO UPDATE SET request = EXCLUDED.request, result = NULL, expires_at = EXCLUDED.expires_at
WHERE t.result IS NULL OR t.expires_at <= EXCLUDED.expires_at - sqlc.arg(window_us)::bigint * interval '1 microsecond';

-- name: ReadIdempotency :one
-- The request and the result (empty for none) of an idempotency key's row,
-- which ClaimIdempotency left to another call and holds: a statement of
-- its own, which under READ COMMITTED sees that call's commit.
SELECT request, COALESCE(result, '') AS result FROM txlimit_idempotency WHERE id = sqlc.arg(id);

-- name: RecordIdempotency :exec
-- Writes the result of the call that claimed an idempotency key.
UPDATE txlimit_idempotency SET result = sqlc.arg(result) WHERE id = sqlc.arg(id);

-- name: DropIdempotency :exec
-- Deletes the row of an idempotency key that the call claimed and that
-- took nothing (a denial): the key is unused again.
DELETE FROM txlimit_idempotency WHERE id = sqlc.arg(id);

-- name: PruneIdempotency :execrows
-- Deletes up to max_rows rows that have expired, oldest first, passing
-- over those other transactions hold (SKIP LOCKED): a repeat taking an
-- expired key over keeps it.
DELETE FROM txlimit_idempotency AS t
USING (
    SELECT p.id FROM txlimit_idempotency AS p
    WHERE p.expires_at <= CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz)
    ORDER BY p.expires_at
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED
) AS e
WHERE t.id = e.id;

-- name: ProbeIdempotency :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- Limiter.Ping's check of txlimit_idempotency.
SELECT id, request, result, expires_at FROM txlimit_idempotency LIMIT 0;
