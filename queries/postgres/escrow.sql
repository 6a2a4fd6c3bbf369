-- name: EscrowClaim :one
-- Escrow mode (docs/escrow.md): the caller's transaction inserts a claim;
-- a separate autocommit statement debits the limit row and records a
-- pending entry; settlement later deletes both, giving the tokens back when
-- the caller did not commit the claim. EscrowClaim runs in the caller's transaction: the claim, and that transaction's
-- top-level id (which it assigns if the transaction had none yet).
INSERT INTO txlimit_escrow_claim DEFAULT VALUES
RETURNING id, CAST(CAST(pg_current_xact_id() AS text) AS bigint) AS xid;

-- name: EscrowUnclaim :exec
-- Runs in the caller's transaction: removes the claim of a call that took
-- nothing (a denial), so that it leaves no row behind.
DELETE FROM txlimit_escrow_claim WHERE id = sqlc.arg(id);

-- name: EscrowDebitBucket :one
-- The escrow take of a token bucket call that is not a reservation, lean:
-- TakeBucket's upsert (its functions, its fresh row computed by the store)
-- that also records the pending entry, for a row the upsert returned only.
-- It returns the new state and the clock when the call was granted, and no
-- row otherwise: the store then reads the row and decides with algo (for
-- RetryAfter), and runs EscrowDebit when algo would grant. An escrow limit
-- has one shard, so unlike TakeBucket this does not look for rows beyond
-- shard 0.
--
-- It is sent alone, as a transaction of its own (no BEGIN, no COMMIT: two
-- fewer statements for the server), so it makes that transaction's commit
-- asynchronous itself (set_config, local to the transaction, evaluated once
-- before the row is touched; see EscrowDebit on why that is safe), and it
-- grants only at READ COMMITTED, the pool's usual default: at a stricter
-- default it proposes no row, so it neither inserts nor locks, and the store
-- learns the level from EscrowRead and sends it inside BEGIN ISOLATION LEVEL
-- READ COMMITTED from then on.
WITH u AS (
    INSERT INTO txlimit AS t (name, key, shard, value, ts)
    SELECT sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
           txlimit_bucket_ts(sqlc.arg(full_ts)::timestamptz, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()))
    FROM (SELECT set_config('synchronous_commit', 'off', true) AS async) AS a
    WHERE sqlc.arg(fresh_ok)::boolean AND current_setting('transaction_isolation') = 'read committed'
    ON CONFLICT (name, key, shard) DO UPDATE
    SET value = txlimit_kept(txlimit_bucket_refill(t.value,
                    CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint),
                    sqlc.arg(rate)::float8, sqlc.arg(period)::bigint, sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
        ts = txlimit_bucket_ts(t.ts, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()))
    WHERE t.value BETWEEN -1e300 AND 1e300
      AND txlimit_fits(txlimit_bucket_refill(t.value,
              CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint),
              sqlc.arg(rate)::float8, sqlc.arg(period)::bigint, sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
          sqlc.arg(capacity)::float8)
    RETURNING t.value, t.ts
), pending AS (
    INSERT INTO txlimit_escrow (claim, xid, name, key, shard, count)
    SELECT sqlc.arg(claim), sqlc.arg(xid), sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(count)
    FROM u
)
SELECT u.value, u.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock
FROM u;

-- name: EscrowDebitWindow :one
-- EscrowDebitBucket for a fixed window, with the window's functions.
WITH u AS (
    INSERT INTO txlimit AS t (name, key, shard, value, ts)
    SELECT sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(fresh_value)::float8,
           txlimit_window_ts(sqlc.arg(full_ts)::timestamptz, f.clock, f.e, sqlc.arg(period)::bigint)
    FROM (SELECT k.clock, CAST(extract(epoch FROM k.clock - sqlc.arg(full_ts)::timestamptz) * 1000000 AS bigint) AS e
          FROM (SELECT COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS clock) AS k) AS f,
         (SELECT set_config('synchronous_commit', 'off', true) AS async) AS a
    WHERE sqlc.arg(fresh_ok)::boolean AND current_setting('transaction_isolation') = 'read committed'
    ON CONFLICT (name, key, shard) DO UPDATE
    SET value = txlimit_kept(txlimit_window_refill(t.value,
                    CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint),
                    sqlc.arg(rate)::float8, sqlc.arg(period)::bigint, sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8),
        ts = txlimit_window_ts(t.ts, COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()),
                 CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint),
                 sqlc.arg(period)::bigint)
    WHERE t.value BETWEEN -1e300 AND 1e300
      AND txlimit_fits(txlimit_window_refill(t.value,
              CAST(extract(epoch FROM COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) - t.ts) * 1000000 AS bigint),
              sqlc.arg(rate)::float8, sqlc.arg(period)::bigint, sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8,
          sqlc.arg(capacity)::float8)
    RETURNING t.value, t.ts
), pending AS (
    INSERT INTO txlimit_escrow (claim, xid, name, key, shard, count)
    SELECT sqlc.arg(claim), sqlc.arg(xid), sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(count)
    FROM u
)
SELECT u.value, u.ts, CAST(COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS timestamptz) AS clock
FROM u;

-- name: EscrowRead :one
-- The row of an escrow key as last committed (NULLs when the key has none)
-- and the clock: what the store decides a denial from, with algo (for
-- RetryAfter), when a lean debit granted nothing; and the isolation level of
-- the pool's transactions, which the lean debits need to be READ COMMITTED.
SELECT t.value, t.ts, CAST(k.clock AS timestamptz) AS clock,
       CAST(current_setting('transaction_isolation') AS text) AS isolation
FROM (SELECT COALESCE(sqlc.narg(now)::timestamptz, statement_timestamp()) AS clock) AS k
LEFT JOIN txlimit AS t ON t.name = sqlc.arg(name) AND t.key = sqlc.arg(key) AND t.shard = 0;

-- name: EscrowDebit :one
-- The escrow take of any call (reservations, and what the lean statements
-- above left to it), in its own short transaction on the store's pool: lock
-- the limit's one row, refill, decide and, when the call fits, write the new
-- state and record the pending entry, all in one statement, so the hot row
-- is held only while it runs. The arithmetic is the functions of migration
-- 00003 (algo.Take's, operation for operation: a differential test holds it
-- to algo): grant when the refilled value covers the count, or as a
-- reservation within max_reserved. It returns the row as it was and the
-- clock, from which the store recomputes the decision with algo for
-- RetryAfter and Remaining, and no row at all when the key has no row yet
-- (the store creates it, full, and runs this again). The clock is read
-- after the row's lock is held: c reads it from o, whose rows come locked;
-- neither is inlined into the query (o locks, c calls a volatile function),
-- and d, used twice, is computed once.
WITH o AS (
    SELECT t.value, t.ts FROM txlimit AS t
    WHERE t.name = sqlc.arg(name) AND t.key = sqlc.arg(key) AND t.shard = 0
    FOR UPDATE
), c AS (
    SELECT o.value, o.ts, k.clock, CAST(extract(epoch FROM k.clock - o.ts) * 1000000 AS bigint) AS e
    FROM o CROSS JOIN (SELECT CAST(COALESCE(sqlc.narg(now)::timestamptz, clock_timestamp()) AS timestamptz) AS clock) AS k
), d AS (
    SELECT c.value, c.ts, c.clock, c.e,
           txlimit_refill(sqlc.arg(kind)::integer, c.value, c.e, sqlc.arg(rate)::float8, sqlc.arg(period)::bigint,
                          sqlc.arg(capacity)::float8) - sqlc.arg(count)::float8 AS left_over
    FROM c
), upd AS (
    UPDATE txlimit AS t
    SET value = CASE WHEN txlimit_fits(d.left_over, sqlc.arg(capacity)::float8) THEN txlimit_kept(d.left_over) ELSE d.left_over END,
        ts = txlimit_refill_ts(sqlc.arg(kind)::integer, d.ts, d.clock, d.e, sqlc.arg(period)::bigint)
    FROM d
    WHERE t.name = sqlc.arg(name) AND t.key = sqlc.arg(key) AND t.shard = 0
      AND (txlimit_fits(d.left_over, sqlc.arg(capacity)::float8)
           OR (sqlc.arg(reserve)::boolean AND txlimit_within_debt(d.left_over, sqlc.arg(capacity)::float8, sqlc.arg(max_reserved)::float8)))
    RETURNING t.shard
), pending AS (
    INSERT INTO txlimit_escrow (claim, xid, name, key, shard, count)
    SELECT sqlc.arg(claim), sqlc.arg(xid), sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(count)
    FROM upd
)
SELECT d.value, d.ts, d.clock, CAST(EXISTS (SELECT 1 FROM upd) AS boolean) AS ok
FROM d;

-- name: EscrowInsertRow :exec
-- Creates the missing row of (name, key), full, for EscrowDebit to lock.
INSERT INTO txlimit (name, key, shard, value, ts)
VALUES (sqlc.arg(name), sqlc.arg(key), 0, sqlc.arg(value), sqlc.arg(ts))
ON CONFLICT (name, key, shard) DO NOTHING;

-- name: EscrowKeyFates :many
-- Step one of settlement, for one key: up to max_entries pending entries
-- whose transaction is no longer in progress (committed, aborted, or too
-- old for pg_xact_status: NULL), oldest first. maybe_refund is set when the
-- transaction aborted or its claim is not visible yet: only step two, a
-- later statement, may conclude that tokens go back.
SELECT e.claim,
       CAST(pg_xact_status(CAST(CAST(e.xid AS text) AS xid8)) IS NOT DISTINCT FROM 'aborted'
            OR NOT EXISTS (SELECT 1 FROM txlimit_escrow_claim AS c WHERE c.id = e.claim) AS boolean) AS maybe_refund
FROM txlimit_escrow AS e
WHERE e.name = sqlc.arg(name) AND e.key = sqlc.arg(key)
  AND pg_xact_status(CAST(CAST(e.xid AS text) AS xid8)) IS DISTINCT FROM 'in progress'
ORDER BY e.claim
LIMIT sqlc.arg(max_entries);

-- name: EscrowFates :many
-- Step one of settlement over every key: EscrowKeyFates, from the claim
-- after the cursor on.
SELECT e.claim,
       CAST(pg_xact_status(CAST(CAST(e.xid AS text) AS xid8)) IS NOT DISTINCT FROM 'aborted'
            OR NOT EXISTS (SELECT 1 FROM txlimit_escrow_claim AS c WHERE c.id = e.claim) AS boolean) AS maybe_refund
FROM txlimit_escrow AS e
WHERE e.claim > sqlc.arg(after)
  AND pg_xact_status(CAST(CAST(e.xid AS text) AS xid8)) IS DISTINCT FROM 'in progress'
ORDER BY e.claim
LIMIT sqlc.arg(max_entries);

-- name: EscrowSettleSpent :many
-- Settles up to max_entries pending calls, from the claim after the cursor
-- on, whose claim is visible: a claim is visible to another transaction only
-- once the caller's transaction has committed with the call in it, so these
-- tokens are spent whatever pg_xact_status would say, and the entry and its
-- claim go, in one statement. Most calls end this way; the others (a claim
-- not visible: the call is in flight, or its transaction rolled back) are
-- left to the two steps below. Entries another settler holds are skipped.
WITH s AS (
    SELECT e.claim FROM txlimit_escrow AS e
    JOIN txlimit_escrow_claim AS c ON c.id = e.claim
    WHERE e.claim > sqlc.arg(after)
    ORDER BY e.claim
    LIMIT sqlc.arg(max_entries)
    FOR UPDATE OF e SKIP LOCKED
), gone_claims AS (
    DELETE FROM txlimit_escrow_claim AS c USING s WHERE c.id = s.claim
)
DELETE FROM txlimit_escrow AS e USING s WHERE e.claim = s.claim
RETURNING e.claim;

-- name: EscrowSettle :many
-- Step two of settlement: settles the listed entries, which step one found
-- ended, in a later statement (so a later snapshot). An entry is settled
-- only when its transaction is visible as ended in this statement's
-- snapshot (pg_visible_in_snapshot: a commit that pg_xact_status already
-- reported but that this snapshot does not show yet waits for the next
-- run), so the claim's absence below really means "not committed". Its
-- claim present: the tokens are spent, both rows go. Its claim absent (the
-- transaction aborted, or rolled back to a savepoint around the call): the
-- count goes back to the limit row, and the entry goes. Nothing here waits
-- for a lock: entries another settler holds are skipped, and so are the
-- refunds whose limit row a transaction holds (the entry stays for the next
-- run). A refund to a row that no longer exists (pruned as full, or reset)
-- is dropped: a missing row is full. The refund adds the count to the row
-- as stored; algo projects a row capped at Capacity, so this equals
-- algo.CreditShards at every later instant.
WITH e AS MATERIALIZED (
    SELECT p.claim, p.name, p.key, p.shard, p.count
    FROM txlimit_escrow AS p
    WHERE p.claim = ANY(sqlc.arg(claims)::bigint[])
      AND pg_xact_status(CAST(CAST(p.xid AS text) AS xid8)) IS DISTINCT FROM 'in progress'
      AND pg_visible_in_snapshot(CAST(CAST(p.xid AS text) AS xid8), pg_current_snapshot())
    ORDER BY p.claim
    FOR UPDATE SKIP LOCKED
), f AS MATERIALIZED (
    SELECT e.claim, e.name, e.key, e.shard, e.count,
           EXISTS (SELECT 1 FROM txlimit_escrow_claim AS c WHERE c.id = e.claim) AS spent
    FROM e
), r AS MATERIALIZED (
    SELECT t.name, t.key, t.shard FROM txlimit AS t
    WHERE (t.name, t.key, t.shard) IN (SELECT f.name, f.key, f.shard FROM f WHERE NOT f.spent)
    ORDER BY t.name, t.key, t.shard
    FOR UPDATE SKIP LOCKED
), done AS MATERIALIZED (
    SELECT f.claim, f.name, f.key, f.shard, f.count, f.spent,
           CAST(NOT f.spent AND EXISTS (SELECT 1 FROM r WHERE r.name = f.name AND r.key = f.key AND r.shard = f.shard) AS boolean) AS refund
    FROM f
    WHERE f.spent
       OR EXISTS (SELECT 1 FROM r WHERE r.name = f.name AND r.key = f.key AND r.shard = f.shard)
       OR NOT EXISTS (SELECT 1 FROM txlimit AS x WHERE x.name = f.name AND x.key = f.key AND x.shard = f.shard)
), gone_claims AS (
    DELETE FROM txlimit_escrow_claim AS c USING done
    WHERE c.id = done.claim AND done.spent
    RETURNING c.id
), gone AS (
    DELETE FROM txlimit_escrow AS p USING done
    WHERE p.claim = done.claim
    RETURNING p.claim
), credited AS (
    UPDATE txlimit AS t
    SET value = t.value + s.total
    FROM (SELECT done.name, done.key, done.shard, sum(done.count) AS total
          FROM done WHERE done.refund
          GROUP BY done.name, done.key, done.shard) AS s
    WHERE t.name = s.name AND t.key = s.key AND t.shard = s.shard
    RETURNING t.name
)
SELECT done.claim, done.spent, done.refund, done.count FROM done;

-- name: EscrowDeleteOrphanClaims :execrows
-- Deletes up to max_claims claims that have no pending entry: those of a
-- call whose debit failed (or that Reset detached) in a transaction that
-- committed anyway. A visible claim belongs to a committed transaction, and
-- its entry, if it was ever made, committed before it; so a visible claim
-- without a visible entry has none, now or later.
DELETE FROM txlimit_escrow_claim AS c
WHERE c.id IN (
    SELECT o.id FROM txlimit_escrow_claim AS o
    WHERE NOT EXISTS (SELECT 1 FROM txlimit_escrow AS p WHERE p.claim = o.id)
    ORDER BY o.id
    LIMIT sqlc.arg(max_claims)
    FOR UPDATE SKIP LOCKED
);

-- name: EscrowDeleteKey :exec
-- Reset of an escrow limit, in the caller's transaction: detaches the
-- pending entries of (name, key), so that a call that rolls back later does
-- not credit tokens taken before the reset to the fresh limit. Their claims
-- become orphans, which settlement deletes.
DELETE FROM txlimit_escrow WHERE name = sqlc.arg(name) AND key = sqlc.arg(key);

-- name: EscrowCount :one
-- The number of pending entries and of claims: the size of the escrow
-- tables, for Settle's result and for tests.
SELECT (SELECT count(*) FROM txlimit_escrow) AS pending,
       (SELECT count(*) FROM txlimit_escrow_claim) AS claims;

-- name: ProbeEscrow :exec
-- Fails when the escrow tables or one of their columns is missing.
SELECT e.claim, e.xid, e.name, e.key, e.shard, e.count, c.id
FROM txlimit_escrow AS e, txlimit_escrow_claim AS c LIMIT 0;
