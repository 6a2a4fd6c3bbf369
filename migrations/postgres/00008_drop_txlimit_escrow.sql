-- Escrow mode is gone (issue 32): its two tables (00002) go, but only after
-- every escrow call still pending in them is settled here, as pgstore's
-- Settle settled it, so that a database upgraded with calls pending loses
-- no token and gives none away.
--
-- What is pending. An escrow call left two rows: a claim in
-- txlimit_escrow_claim, inserted by the caller's transaction, so visible to
-- anyone else exactly when that transaction committed with the call in it;
-- and an entry in txlimit_escrow (claim, the caller's xid, name, key, shard,
-- count), inserted with the limit's debit by a short transaction of the
-- store's own that committed at once. Settle's rule (queries/postgres/
-- escrow.sql, EscrowSettleSpent and EscrowSettle), once the caller's
-- transaction has ended:
--   - claim visible: the caller committed; its tokens stay spent.
--   - claim not visible: the caller rolled back, crashed, rolled back to a
--     savepoint around the call, or cancelled the call (LimitAll's unclaim):
--     the count goes back to the limit's row (name, key, shard) as stored,
--     value + count, and ts is left alone. No cap is written because the row
--     holds no capacity. Every reader projects a row capped (the refill
--     functions' least(..., capacity) even for no time elapsed,
--     algo.Project), so the row reads as min(value + count, capacity), which
--     is algo.CreditShards for the one shard an escrow limit has.
--   - claim not visible and no row (pruned as full, or reset by a Reset
--     that did not know the limit was escrow): dropped. A missing row is a
--     full limit: there is nothing to give back, and no row is made.
-- A refund goes to whatever row (name, key, shard) holds now, as Settle's
-- did. Entries a Reset detached are already gone, so a key reset since gets
-- nothing that was taken before the reset. Claims without an entry (a
-- debit that failed in a transaction that committed anyway, or one that
-- Reset detached) are orphans Settle deleted: dropping the table does that.
-- Refunds to one row are summed in claim order and added once. Settle added
-- one sum per batch of 500, so with fractional counts the last bit may
-- differ from what one particular run of Settle would have written. No
-- token is lost or given by that.
--
-- A caller whose transaction is still open is waited for, never guessed.
-- The first three statements below wait until no transaction that made an
-- escrow call is open:
--   1. LOCK txlimit_escrow_claim waits for every open transaction that
--      inserted a claim: it holds ROW EXCLUSIVE on the table until it ends.
--   2. LOCK txlimit_escrow waits for a debit still running on the store's
--      connection.
--   3. DROP IDENTITY drops the claims' id sequence, which waits for the
--      transactions that drew an id in a savepoint they rolled back. That
--      rollback released their lock on the table, but a sequence's lock
--      belongs to the top-level transaction. (Their claims are dead either
--      way. Waiting here rather than at DROP TABLE keeps the wait before the
--      refunds lock any limit's row.)
-- PostgreSQL releases a transaction's locks only after its end is visible to
-- new snapshots. So from then on every claim is seen as it will stay, and
-- Settle's question, "has the caller's transaction ended?", is answered yes
-- for every entry. While the locks are held, new escrow calls queue on their
-- claim's INSERT and then fail on the missing table, before any debit. That
-- is safe: their callers roll back having taken nothing.
--
-- Why wait rather than fail with "N calls pending": the wait is needed to
-- be exact anyway. A call whose claim is inserted but whose debit has not
-- committed yet has no entry to count; only its caller's lock shows it.
-- DROP TABLE would wait for the same transactions. Waiting settles each
-- call on its real outcome with no step for the operator. The wait lasts
-- as long as the longest open transaction that made an escrow call
-- (including a prepared transaction, until it is committed or rolled back),
-- and escrow calls queue meanwhile. To bound it, stop escrow traffic first
-- (deploy the application without Config.Escrow), or run the migration
-- with a lock_timeout (for example lock_timeout=10s among the parameters of
-- a pgx DSN, which sends it as a setting). When the timeout expires the
-- migration fails ("canceling statement due to lock timeout", SQLSTATE
-- 55P03). It has changed nothing then, because goose runs it in one
-- transaction. End or wait out the transactions that pg_locks shows holding
-- txlimit_escrow_claim or its sequence, then rerun migrations.Up.
--
-- Order and placement matter:
-- - The claim table is locked first. A caller in flight waits, in the
--   client, for its debit on another connection, a wait PostgreSQL's
--   deadlock detector cannot see. Holding txlimit_escrow first would block
--   that debit while this migration waited for its caller, forever.
-- - The LOCKs come first in the transaction (goose runs each migration in
--   a transaction of its own). A LOCK takes no snapshot, so the snapshot
--   every later statement reads with is taken after the locks, whatever
--   the isolation level. At READ COMMITTED each statement takes a new one
--   anyway. At REPEATABLE READ or SERIALIZABLE the transaction's snapshot
--   would otherwise predate the wait and miss the calls that ended during
--   it. Do not run these statements after others in such a transaction.
--   (The snapshot that step 3 takes is late enough: only callers with dead
--   claims end during its wait.)
-- - A refund waits for the row lock of a transaction that holds that limit's
--   row. If that transaction then makes an escrow call, it waits for these
--   locks: PostgreSQL detects that deadlock and aborts one of the two. If
--   the migration is the one aborted, it has changed nothing; rerun it.
--   (At REPEATABLE READ a refund to a row that changed during step 3's wait
--   fails with a serialization error, just as safely.)

-- +goose Up
LOCK TABLE txlimit_escrow_claim IN ACCESS EXCLUSIVE MODE;
LOCK TABLE txlimit_escrow IN ACCESS EXCLUSIVE MODE;
ALTER TABLE txlimit_escrow_claim ALTER COLUMN id DROP IDENTITY;

UPDATE txlimit AS t
SET value = t.value + r.total
FROM (SELECT e.name, e.key, e.shard, sum(e.count ORDER BY e.claim) AS total
      FROM txlimit_escrow AS e
      WHERE NOT EXISTS (SELECT 1 FROM txlimit_escrow_claim AS c WHERE c.id = e.claim)
      GROUP BY e.name, e.key, e.shard) AS r
WHERE t.name = r.name AND t.key = r.key AND t.shard = r.shard;

DROP TABLE txlimit_escrow;
DROP TABLE txlimit_escrow_claim;

-- +goose Down
-- The tables come back empty, as 00007 left them: no CHECK on shard (00007
-- dropped it, and its Down adds it back), so that migrating further down
-- works. Nothing writes them any more.
CREATE TABLE txlimit_escrow_claim (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY
);

CREATE TABLE txlimit_escrow (
    claim bigint           PRIMARY KEY,
    xid   bigint           NOT NULL,
    name  text             NOT NULL,
    key   text             NOT NULL,
    shard integer          NOT NULL,
    count double precision NOT NULL
);

CREATE INDEX txlimit_escrow_key ON txlimit_escrow (name, key, claim);
