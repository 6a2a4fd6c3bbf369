-- The statements of idempotent takes (txlimit.Idempotent) on the
-- txlimit_idempotency table (migration 00005): one row per idempotency
-- key, with the request it was first used for, that call's result (NULL
-- until the call records it) and the instant it expires, in microseconds
-- since the Unix epoch from the store's clock. A claim is a write, which
-- takes the database's write lock: a repeat in another transaction waits
-- for the first to end.

-- name: ExpireIdempotency :exec
-- Deletes the row of an idempotency key when it has expired at now or
-- holds no result: the key is unused. Run first, it takes the write lock,
-- under which ClaimIdempotency follows.
DELETE FROM txlimit_idempotency
WHERE id = sqlc.arg(id) AND (result IS NULL OR expires_at <= sqlc.arg(now));

-- name: ClaimIdempotency :execrows
-- Inserts the row of an idempotency key, expiring at expires_at, unless
-- it has one: 1 when it inserted it, 0 when the row is another call's.
INSERT INTO txlimit_idempotency (id, request, result, expires_at)
VALUES (sqlc.arg(id), sqlc.arg(request), NULL, sqlc.arg(expires_at))
ON CONFLICT (id) DO NOTHING;

-- name: ReadIdempotency :one
-- The request and the result (empty for none) of an idempotency key's row.
SELECT request, COALESCE(result, '') AS result FROM txlimit_idempotency WHERE id = sqlc.arg(id);

-- name: RecordIdempotency :exec
-- Writes the result of the call that claimed an idempotency key.
UPDATE txlimit_idempotency SET result = sqlc.arg(result) WHERE id = sqlc.arg(id);

-- name: DropIdempotency :exec
-- Deletes the row of an idempotency key that the call claimed and that
-- took nothing (a denial): the key is unused again.
DELETE FROM txlimit_idempotency WHERE id = sqlc.arg(id);

-- name: PruneIdempotency :execrows
-- Deletes up to max_rows rows that have expired at now, oldest first.
DELETE FROM txlimit_idempotency
WHERE id IN (
    SELECT p.id FROM txlimit_idempotency AS p
    WHERE p.expires_at <= sqlc.arg(now)
    ORDER BY p.expires_at
    LIMIT sqlc.arg(max_rows)
);

-- name: ProbeIdempotency :exec
-- Reads no row, but fails when the table or one of its columns is missing.
SELECT id, request, result, expires_at FROM txlimit_idempotency LIMIT 0;
