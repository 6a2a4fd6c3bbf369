-- The statements on lists of rows. A list comes as one JSON array bound as
-- ?, the one way both MySQL and MariaDB turn a list into rows (JSON_TABLE,
-- which sqlc's MySQL engine does not parse). Names and keys are in
-- hexadecimal, so that no character set stands between Go's bytes and the
-- VARBINARY columns; values are the shortest decimals that read back as the
-- same float64s (CAST parses them exactly; a JSON number goes through the
-- JSON parser, which need not).
--
-- A statement that locks listed rows does it by their primary keys, in the
-- order of the list: STRAIGHT_JOIN makes the array drive the join, and
-- FORCE INDEX keeps the optimizer from scanning the table (a locking scan
-- locks every row it reads).

-- name: EnsureRows
-- Creates the listed rows that are missing, as placeholders (their limit's
-- full state: the same as no row), and locks the ones that exist, one after
-- the other in the order of the list, waiting for the transactions that hold
-- them. ON DUPLICATE KEY UPDATE locks the row it finds by its primary key
-- and no gap (see take.sql for why that matters); its assignment changes
-- nothing. Rows: [name, key, shard, value, ts, prev].
INSERT INTO txlimit (name, `key`, shard, value, prev, ts)
SELECT UNHEX(j.n), UNHEX(j.k), j.s, CAST(j.v AS DOUBLE), CAST(j.p AS DOUBLE), j.t
FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]',
                                   s INT PATH '$[2]', v VARCHAR(32) PATH '$[3]', t DATETIME(6) PATH '$[4]',
                                   p VARCHAR(32) PATH '$[5]')) AS j
ORDER BY j.i
ON DUPLICATE KEY UPDATE shard = txlimit.shard

-- name: WriteRows
-- Stores the new state of several rows the transaction holds (or creates
-- one that is missing), and their pause: paused_until as a DATETIME(6)
-- literal, '' for none (NULL). Rows: [name, key, shard, value, ts, prev,
-- paused_until].
INSERT INTO txlimit (name, `key`, shard, value, prev, ts, paused_until)
SELECT UNHEX(j.n), UNHEX(j.k), j.s, CAST(j.v AS DOUBLE), CAST(j.p AS DOUBLE), j.t, CAST(NULLIF(j.u, '') AS DATETIME(6))
FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', s INT PATH '$[2]',
                                   v VARCHAR(32) PATH '$[3]', t DATETIME(6) PATH '$[4]', p VARCHAR(32) PATH '$[5]',
                                   u VARCHAR(32) PATH '$[6]')) AS j
ON DUPLICATE KEY UPDATE value = CAST(j.v AS DOUBLE), prev = CAST(j.p AS DOUBLE), ts = j.t,
                        paused_until = CAST(NULLIF(j.u, '') AS DATETIME(6))

-- name: DeleteRows
-- Deletes the listed rows, which the transaction holds, by their primary
-- keys. Rows: [name, key, shard].
DELETE t FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', s INT PATH '$[2]')) AS j
STRAIGHT_JOIN txlimit AS t FORCE INDEX (PRIMARY)
    ON t.name = UNHEX(j.n) AND t.`key` = UNHEX(j.k) AND t.shard = j.s

-- name: Tops
-- The highest shard of each listed key (-1 for none) as the transaction's
-- snapshot has it, locking nothing: TakeAll locks those rows too, in their
-- place in the canonical order. Keys: [name, key].
SELECT j.i, CAST(COALESCE((SELECT MAX(m.shard) FROM txlimit AS m
                           WHERE m.name = UNHEX(j.n) AND m.`key` = UNHEX(j.k)), -1) AS SIGNED) AS top
FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]')) AS j
ORDER BY j.i

-- name: LockRows
-- Locks the listed rows, which exist, waiting for the transactions that hold
-- them, and reads them with the clock. Rows: [name, key, shard].
SELECT j.i, t.shard, t.value, t.prev, t.ts, t.paused_until, UTC_TIMESTAMP(6) AS clock
FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', s INT PATH '$[2]')) AS j
STRAIGHT_JOIN txlimit AS t FORCE INDEX (PRIMARY)
    ON t.name = UNHEX(j.n) AND t.`key` = UNHEX(j.k) AND t.shard = j.s
ORDER BY j.i
FOR UPDATE

-- name: LockIdle
-- LockRows for the listed rows that no other transaction holds, without
-- waiting (SKIP LOCKED): a batch of Prune never waits for a row live traffic
-- holds, and locks no gap that live traffic's inserts would wait for.
SELECT j.i, t.shard, t.value, t.prev, t.ts, t.paused_until, UTC_TIMESTAMP(6) AS clock
FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', s INT PATH '$[2]')) AS j
STRAIGHT_JOIN txlimit AS t FORCE INDEX (PRIMARY)
    ON t.name = UNHEX(j.n) AND t.`key` = UNHEX(j.k) AND t.shard = j.s
ORDER BY j.i
FOR UPDATE SKIP LOCKED
