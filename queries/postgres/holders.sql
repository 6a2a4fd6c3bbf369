-- The statements of concurrency limits (txlimit.Concurrency) on the
-- txlimit_holder table (migration 00010): one row per holder of a slot of
-- (name, key), and the key's lock row, whose holder is ''. Every statement
-- touches the rows of one (name, key), so they suit a table distributed by
-- key (SingleKeyStatements) as they are. The clock is the argument now or,
-- when it is NULL, the server's clock_timestamp().

-- name: LockHolderKey :execrows
-- Creates the lock row of (name, key) if it is missing, or locks it,
-- waiting for the transaction that holds it: every acquire and extend of
-- the key runs it first, so that they count and change the key's holders
-- one transaction at a time. DO UPDATE … WHERE false updates nothing but
-- locks the conflicting row (DO NOTHING would pass over it unlocked), and a
-- row deleted meanwhile (Prune) makes the insertion retry; under
-- REPEATABLE READ and SERIALIZABLE, a lock row that a transaction
-- committed after this one's snapshot (a grant raises its expiry) is a
-- serialization failure rather than a lock on a stale count. 1 when it
-- created the row. The new row expires at once: it is the key's until a
-- grant raises it.
INSERT INTO txlimit_holder (name, key, holder, expires_at)
VALUES (sqlc.arg(name), sqlc.arg(key), '', COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()))
ON CONFLICT (name, key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at WHERE false;

-- name: ReadHolders :many
-- The holders of (name, key), the lock row left out, in order of expiry,
-- with the clock; a single row with an empty holder when there is none.
-- Run after LockHolderKey, as a statement of its own, it sees every holder
-- committed before the lock was held (READ COMMITTED takes a snapshot per
-- statement); alone, it is Check's read, which locks nothing.
SELECT COALESCE(h.holder, '') AS holder, h.expires_at, c.clock
FROM (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS c
LEFT JOIN txlimit_holder AS h ON h.name = sqlc.arg(name) AND h.key = sqlc.arg(key) AND h.holder <> ''
ORDER BY h.expires_at, h.holder;

-- name: GrantHolder :one
-- Writes the grant of a slot of (name, key), whose lock row the
-- transaction holds: it deletes the listed holders (reclaim, a text array)
-- that are still there and expired at the decision's clock (at), inserts
-- the holder or moves its expiry, and raises the lock row's expiry to the
-- holder's. It returns the ids it deleted, as a JSON array.
WITH reclaimed AS (
    DELETE FROM txlimit_holder AS r
    WHERE r.name = sqlc.arg(name) AND r.key = sqlc.arg(key) AND r.holder <> ''
      AND r.holder = ANY (sqlc.arg(reclaim)::text::text[]) AND r.expires_at <= sqlc.arg(at)::timestamptz
    RETURNING r.holder
), granted AS (
    INSERT INTO txlimit_holder (name, key, holder, expires_at)
    VALUES (sqlc.arg(name), sqlc.arg(key), sqlc.arg(holder), sqlc.arg(expires_at)::timestamptz)
    ON CONFLICT (name, key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at
    RETURNING 1
), raised AS (
    UPDATE txlimit_holder AS l SET expires_at = greatest(l.expires_at, sqlc.arg(expires_at)::timestamptz)
    WHERE l.name = sqlc.arg(name) AND l.key = sqlc.arg(key) AND l.holder = ''
    RETURNING 1
)
SELECT CAST(COALESCE((SELECT json_agg(holder) FROM reclaimed), '[]') AS text) AS reclaimed;

-- name: AcquireHolder :one
-- The whole acquire of one slot of (name, key) in one statement, sent in
-- one round trip after LockHolderKey (an acquire without rate limits): it
-- counts the live holders at the clock, grants when fewer than capacity
-- are live or the holder is one of them, and then reclaims the expired
-- holders (but the holder's own row), inserts the holder or moves its
-- expiry to the clock plus hold_for (µs), and raises the lock row's expiry
-- to it: GrantHolder's writes, decided in the statement (driver.DecideSlot's
-- rule). It returns the clock, the live holders before the call, whether
-- the holder was one, the decision, the holder's expiry, for a denial the
-- instant a slot comes back (the expiry of the live holder that leaves
-- capacity - 1 live once it has passed; the clock after a grant), and the ids it reclaimed as a JSON
-- array. The data-modifying WITH queries run once, whatever reads them, on
-- the statement's snapshot, which under READ COMMITTED is taken after
-- LockHolderKey held the lock.
WITH c AS (
    SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
), held AS (
    SELECT h.holder, h.expires_at FROM txlimit_holder AS h
    WHERE h.name = sqlc.arg(name) AND h.key = sqlc.arg(key) AND h.holder <> ''
), d AS (
    SELECT c.clock,
           count(held.holder) FILTER (WHERE held.expires_at > c.clock) AS live,
           COALESCE(bool_or(held.holder = sqlc.arg(holder)::text AND held.expires_at > c.clock), false) AS mine
    FROM c LEFT JOIN held ON true
    GROUP BY c.clock
), g AS (
    SELECT d.clock, d.live, d.mine, (d.mine OR d.live < sqlc.arg(capacity)::bigint) AS granted,
           d.clock + sqlc.arg(hold_for)::bigint * interval '1 microsecond' AS expires
    FROM d
), reclaimed AS (
    DELETE FROM txlimit_holder AS r USING g
    WHERE g.granted AND r.name = sqlc.arg(name) AND r.key = sqlc.arg(key) AND r.holder <> ''
      AND r.holder <> sqlc.arg(holder) AND r.expires_at <= g.clock
    RETURNING r.holder
), granted AS (
    INSERT INTO txlimit_holder (name, key, holder, expires_at)
    SELECT sqlc.arg(name), sqlc.arg(key), sqlc.arg(holder), g.expires FROM g WHERE g.granted
    ON CONFLICT (name, key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at
    RETURNING 1
), raised AS (
    UPDATE txlimit_holder AS l SET expires_at = greatest(l.expires_at, g.expires)
    FROM g
    WHERE g.granted AND l.name = sqlc.arg(name) AND l.key = sqlc.arg(key) AND l.holder = ''
    RETURNING 1
)
SELECT g.clock, g.live, CAST(g.mine AS boolean) AS mine, CAST(g.granted AS boolean) AS granted,
       CAST(g.expires AS timestamptz) AS expires,
       CAST(COALESCE((SELECT x.expires_at FROM (
                SELECT held.expires_at, row_number() OVER (ORDER BY held.expires_at) AS n
                FROM held WHERE held.expires_at > g.clock) AS x
             WHERE x.n = g.live - sqlc.arg(capacity)::bigint + 1), g.clock) AS timestamptz) AS free,
       CAST(COALESCE((SELECT json_agg(holder) FROM reclaimed), '[]') AS text) AS reclaimed
FROM g;

-- name: DropLock :exec
-- Deletes the lock row of (name, key), which the transaction created: an
-- acquire that granted nothing leaves no row behind.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND key = sqlc.arg(key) AND holder = '';

-- name: ReleaseHolder :one
-- Deletes one holder of (name, key), live or expired, and says whether it
-- was live at the clock. It locks that row only: fewer holders never make
-- an acquire admit too many.
WITH c AS (
    SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
), released AS (
    DELETE FROM txlimit_holder AS h
    WHERE h.name = sqlc.arg(name) AND h.key = sqlc.arg(key) AND h.holder = sqlc.arg(holder) AND h.holder <> ''
    RETURNING h.expires_at
)
SELECT c.clock, EXISTS (SELECT 1 FROM released WHERE released.expires_at > c.clock) AS live FROM c;

-- name: ExtendHolder :one
-- Moves the expiry of a live holder of (name, key) to the clock plus
-- hold_for (µs), and raises the lock row's expiry to it; run after
-- LockHolderKey, so that no acquire counts the holder as expired while the
-- extend commits. expires_at is NULL when the holder was not live.
WITH c AS (
    SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock
), extended AS (
    UPDATE txlimit_holder AS h SET expires_at = c.clock + sqlc.arg(hold_for)::bigint * interval '1 microsecond'
    FROM c
    WHERE h.name = sqlc.arg(name) AND h.key = sqlc.arg(key) AND h.holder = sqlc.arg(holder) AND h.holder <> ''
      AND h.expires_at > c.clock
    RETURNING h.expires_at
), raised AS (
    UPDATE txlimit_holder AS l SET expires_at = greatest(l.expires_at, e.expires_at)
    FROM extended AS e
    WHERE l.name = sqlc.arg(name) AND l.key = sqlc.arg(key) AND l.holder = ''
    RETURNING 1
)
SELECT c.clock, e.expires_at FROM c LEFT JOIN extended AS e ON true;

-- name: DeleteHolders :exec
-- Deletes every holder of (name, key) and its lock row: Reset.
DELETE FROM txlimit_holder WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);

-- name: PruneHolders :execrows
-- Deletes up to max_rows rows that have expired, holders and lock rows
-- alike, passing over those other transactions hold (SKIP LOCKED): an
-- expired holder counts for nothing, and a lock row expires only once every
-- holder of its key has. A lock row a grant raised after this statement's
-- snapshot is checked again as it is locked, and kept.
DELETE FROM txlimit_holder AS t
USING (
    SELECT p.name, p.key, p.holder FROM txlimit_holder AS p
    WHERE p.expires_at <= CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz)
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED
) AS e
WHERE t.name = e.name AND t.key = e.key AND t.holder = e.holder;

-- name: ProbeHolders :exec
-- Reads no row, but fails when the table or one of its columns is missing:
-- Limiter.Ping's check of txlimit_holder.
SELECT name, key, holder, expires_at FROM txlimit_holder LIMIT 0;
