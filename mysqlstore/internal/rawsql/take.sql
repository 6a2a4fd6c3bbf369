-- The one-statement take (package takerow): one admitted call on an
-- unsharded limit as one INSERT … ON DUPLICATE KEY UPDATE that creates the
-- row or locks it (waiting for the transaction that holds it), refills it to
-- the clock, decides and writes, as algo.Take does, and writes nothing when
-- the call is not granted or the stored value is not finite; the store's
-- locked path, which decides with algo in Go, then takes over (a denial
-- costs it a round trip more).
--
-- Why an INSERT: under REPEATABLE READ, InnoDB locks the gap where a row it
-- looks for is missing, and gap locks do not conflict with each other but do
-- block inserts; two transactions that both looked for new keys in the same
-- gap and then both insert wait for each other (the deadlock Bucket4j and
-- gravitee met on the first use of new keys). INSERT … ON DUPLICATE KEY
-- UPDATE takes no gap lock: it creates a missing row (locked by its
-- creation) or locks the one it finds by its primary key. It is one INSERT …
-- VALUES: INSERT … SELECT from a derived table would cost the server a
-- temporary table per call.
--
-- A missing row is full (algo.Full), and a call on it leaves :full_value =
-- Capacity - Count whatever the clock (driver.Fresh); the store proposes the
-- row only when the call fits a full bucket without a reservation (a call
-- that does not fit a full bucket fits no row; a reservation on a new key
-- takes the locked path). Its time is algo.Project's of the full state's,
-- :full_ts.
--
-- The ON DUPLICATE KEY UPDATE branch refills the row it locked (its latest
-- version, not the transaction's snapshot) and decides. MySQL assigns the
-- columns from left to right, each seeing the ones before it already
-- assigned, so the decision is made once, in the first assignment, each
-- step kept in a user variable for the steps after it (an OR is evaluated
-- from left to right and stops at the first true operand): @txlimit_e the
-- elapsed microseconds, @txlimit_p the refilled value, @txlimit_l what the
-- count leaves of it, @txlimit_ok the decision, carried to the other
-- columns. The new row's time expression sets @txlimit_ok for a row it
-- creates, and @txlimit_now, the clock, which TakeRead reads back on MySQL:
-- UTC_TIMESTAMP(6), the server's time in UTC whatever the session's
-- time_zone, read (like NOW(6)) when the statement starts (see "Clock" in
-- mysqlstore's package documentation for why that and not SYSDATE(6)), or
-- in the Any forms :now, the call's own, when it is not NULL. They
-- are session variables of the connection that runs the caller's
-- transaction, set by every call before it reads them. (MySQL 8.0.13
-- deprecated setting user variables inside other statements, with a
-- warning; MariaDB has not.)
--
-- The arithmetic is algo's, operation for operation, on DOUBLE (IEEE
-- doubles) and BIGINT microseconds (TIMESTAMPDIFF and TIMESTAMPADD are exact
-- on DATETIME(6)), so that the state written is bit for bit the one algo
-- computes; TestTakeRowMatchesAlgo (mysqlstore) holds it to algo. Every
-- float64 is read through CAST(… AS DOUBLE): with interpolateParams the
-- driver writes 0.5 as a literal that MySQL reads as an exact DECIMAL, and
-- an expression of DECIMALs alone is not IEEE arithmetic; the CAST converts
-- it once, correctly rounded. A product of the BIGINT @txlimit_e with a
-- DOUBLE converts it first (exactly, below 2^53 µs), as a CAST would.
--
-- The grant: a finite stored value of a row no sharded config wrote
-- (mysqlstore marks row 0 of a sharded limit with its number of shards in
-- prev, which the kinds served here leave 0: its other shards must be
-- pooled) and no pause has marked (paused_until, ended or not: the Go path
-- decides on it, and clears one that has ended), and the count fits, or, when :reserve, is a reservation within
-- MaxReserved (:capped, :target = Count - MaxReserved) whose wait is surely
-- below 2e15 µs (63 years, a bound from above: a longer one is left to the
-- Go path, which refuses waits a Decision cannot hold). What is left is
-- floored at 0 within the tolerance (algo.TakeShards on one shard). algo
-- writes 0 for the third number of the kinds that do not use it (a row a
-- sliding window left).
--
-- Each kind has two statements: TakeBucket and TakeWindow for a plain take
-- on the server's clock, nearly every call, and TakeBucketAny and
-- TakeWindowAny for any call, a reservation or one on the call's own clock.
-- The server parses the statement on every call (interpolateParams sends it
-- as text), and parsing is most of what the take costs it: under callgrind
-- (MariaDB 10.11, BEGIN; the take; COMMIT) the Any form costs about 600k
-- instructions a transaction, the plain one about 460k. Every form is
-- exercised by TestTakeRowMatchesAlgo.
--
-- sqlc's MySQL engine does not compile these: it leaves sqlc.arg() inside a
-- user variable assignment unreplaced, and knows UTC_TIMESTAMP only without
-- its precision.

-- name: TakeBucket
-- A plain take on the server's clock (nearly every call) on a token bucket:
-- the elapsed microseconds times Rate per Period, nothing for a clock at or
-- behind the row's time, capped at Capacity; the row's time moves to the
-- clock when anything was added. A new row's is the clock itself, which is
-- algo.Project's time of the full state's, the epoch, at any clock the
-- server can read.
INSERT INTO txlimit (name, `key`, shard, value, ts)
VALUES (:name, :key, 0, CAST(:full_value AS DOUBLE),
        IF((@txlimit_ok := 1) AND (@txlimit_now := UTC_TIMESTAMP(6)) IS NOT NULL, UTC_TIMESTAMP(6), NULL))
ON DUPLICATE KEY UPDATE
    value = IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, ts, UTC_TIMESTAMP(6))) IS NULL
               OR (@txlimit_p := IF(@txlimit_e <= 0, LEAST(value, CAST(:capacity AS DOUBLE)),
                                    LEAST(value + @txlimit_e * CAST(:rate AS DOUBLE) / CAST(:period_f AS DOUBLE), CAST(:capacity AS DOUBLE)))) IS NULL
               OR (@txlimit_l := @txlimit_p - CAST(:count AS DOUBLE)) IS NULL
               OR NOT (@txlimit_ok := (value BETWEEN -1e300 AND 1e300 AND prev = 0 AND paused_until IS NULL AND @txlimit_l >= -CAST(:tol AS DOUBLE))),
               value, IF(@txlimit_l > 0, @txlimit_l, 0e0)),
    ts = IF(@txlimit_ok AND @txlimit_e > 0, UTC_TIMESTAMP(6), ts),
    prev = IF(@txlimit_ok, 0e0, prev)

-- name: TakeWindow
-- A plain take on the server's clock on a fixed window: whole windows of
-- :period refill Rate each, within one nothing is added, the value is capped
-- at Capacity; the row's time moves to the current window's start when a
-- window passed.
INSERT INTO txlimit (name, `key`, shard, value, ts)
VALUES (:name, :key, 0, CAST(:full_value AS DOUBLE),
        IF((@txlimit_ok := 1) AND (@txlimit_now := UTC_TIMESTAMP(6)) IS NOT NULL,
           IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, CAST(:full_ts AS DATETIME(6)), UTC_TIMESTAMP(6))) < :period,
              CAST(:full_ts AS DATETIME(6)), TIMESTAMPADD(MICROSECOND, -(@txlimit_e MOD :period), UTC_TIMESTAMP(6))),
           NULL))
ON DUPLICATE KEY UPDATE
    value = IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, ts, UTC_TIMESTAMP(6))) IS NULL
               OR (@txlimit_p := IF(@txlimit_e < :period, LEAST(value, CAST(:capacity AS DOUBLE)),
                                    LEAST(value + CAST(:rate AS DOUBLE) * (@txlimit_e DIV :period), CAST(:capacity AS DOUBLE)))) IS NULL
               OR (@txlimit_l := @txlimit_p - CAST(:count AS DOUBLE)) IS NULL
               OR NOT (@txlimit_ok := (value BETWEEN -1e300 AND 1e300 AND prev = 0 AND paused_until IS NULL AND @txlimit_l >= -CAST(:tol AS DOUBLE))),
               value, IF(@txlimit_l > 0, @txlimit_l, 0e0)),
    ts = IF(@txlimit_ok AND @txlimit_e >= :period, TIMESTAMPADD(MICROSECOND, -(@txlimit_e MOD :period), UTC_TIMESTAMP(6)), ts),
    prev = IF(@txlimit_ok, 0e0, prev)

-- name: TakeBucketAny
-- TakeBucket for any call: a reservation, or on the call's own clock.
INSERT INTO txlimit (name, `key`, shard, value, ts)
VALUES (:name, :key, 0, CAST(:full_value AS DOUBLE),
        IF((@txlimit_ok := 1) AND (@txlimit_now := COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))) IS NOT NULL,
           IF(TIMESTAMPDIFF(MICROSECOND, CAST(:full_ts AS DATETIME(6)), @txlimit_now) <= 0, CAST(:full_ts AS DATETIME(6)), @txlimit_now),
           NULL))
ON DUPLICATE KEY UPDATE
    value = IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, ts, @txlimit_now)) IS NULL
               OR (@txlimit_p := IF(@txlimit_e <= 0, LEAST(value, CAST(:capacity AS DOUBLE)),
                                    LEAST(value + @txlimit_e * CAST(:rate AS DOUBLE) / CAST(:period_f AS DOUBLE), CAST(:capacity AS DOUBLE)))) IS NULL
               OR (@txlimit_l := @txlimit_p - CAST(:count AS DOUBLE)) IS NULL
               OR NOT (@txlimit_ok := (value BETWEEN -1e300 AND 1e300 AND prev = 0 AND paused_until IS NULL AND (@txlimit_l >= -CAST(:tol AS DOUBLE)
                   OR (:reserve AND (:capped = 0 OR @txlimit_p - CAST(:target AS DOUBLE) >= -CAST(:tol AS DOUBLE))
                       AND (-@txlimit_l / CAST(:rate AS DOUBLE) + 2) * CAST(:period_f AS DOUBLE) + CAST(GREATEST(-@txlimit_e, 0) AS DOUBLE) < 2e15)))),
               value, IF(@txlimit_l >= -CAST(:tol AS DOUBLE), IF(@txlimit_l > 0, @txlimit_l, 0e0), @txlimit_l)),
    ts = IF(@txlimit_ok AND @txlimit_e > 0, @txlimit_now, ts),
    prev = IF(@txlimit_ok, 0e0, prev)

-- name: TakeWindowAny
-- TakeWindow for any call: a reservation, or on the call's own clock.
INSERT INTO txlimit (name, `key`, shard, value, ts)
VALUES (:name, :key, 0, CAST(:full_value AS DOUBLE),
        IF((@txlimit_ok := 1) AND (@txlimit_now := COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))) IS NOT NULL,
           IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, CAST(:full_ts AS DATETIME(6)), @txlimit_now)) < :period,
              CAST(:full_ts AS DATETIME(6)), TIMESTAMPADD(MICROSECOND, -(@txlimit_e MOD :period), @txlimit_now)),
           NULL))
ON DUPLICATE KEY UPDATE
    value = IF((@txlimit_e := TIMESTAMPDIFF(MICROSECOND, ts, @txlimit_now)) IS NULL
               OR (@txlimit_p := IF(@txlimit_e < :period, LEAST(value, CAST(:capacity AS DOUBLE)),
                                    LEAST(value + CAST(:rate AS DOUBLE) * (@txlimit_e DIV :period), CAST(:capacity AS DOUBLE)))) IS NULL
               OR (@txlimit_l := @txlimit_p - CAST(:count AS DOUBLE)) IS NULL
               OR NOT (@txlimit_ok := (value BETWEEN -1e300 AND 1e300 AND prev = 0 AND paused_until IS NULL AND (@txlimit_l >= -CAST(:tol AS DOUBLE)
                   OR (:reserve AND (:capped = 0 OR @txlimit_p - CAST(:target AS DOUBLE) >= -CAST(:tol AS DOUBLE))
                       AND (-@txlimit_l / CAST(:rate AS DOUBLE) + 2) * CAST(:period_f AS DOUBLE) + CAST(GREATEST(-@txlimit_e, 0) AS DOUBLE) < 2e15)))),
               value, IF(@txlimit_l >= -CAST(:tol AS DOUBLE), IF(@txlimit_l > 0, @txlimit_l, 0e0), @txlimit_l)),
    ts = IF(@txlimit_ok AND @txlimit_e >= :period, TIMESTAMPADD(MICROSECOND, -(@txlimit_e MOD :period), @txlimit_now), ts),
    prev = IF(@txlimit_ok, 0e0, prev)

-- name: TakeReturning
-- Appended to TakeBucket and TakeWindow on MariaDB (10.5 and later): what
-- the statement wrote, whether it granted and the clock (the statement's own
-- UTC_TIMESTAMP(6), the same instant; a call's own clock is the caller's),
-- in the one round trip. MariaDB reads a user variable in RETURNING as the
-- statement left it, except one that did not exist before the statement
-- (the first call on a connection), which reads NULL, and one that is a
-- plain operand or under CAST, which reads as it was before: hence
-- "@txlimit_ok + 0", and TakeReadOK after a NULL. MySQL has no RETURNING;
-- TakeRead reads the same in a second statement there.
RETURNING value, ts, @txlimit_ok + 0, UTC_TIMESTAMP(6)

-- name: TakeRead
-- What the take did, in the same transaction just after it: the row as the
-- transaction now has it (its own write; a consistent read), the clock and
-- whether it granted.
SELECT t.value, t.ts, CAST(@txlimit_now AS DATETIME(6)) AS clock, CAST(@txlimit_ok AS SIGNED) AS ok
FROM txlimit AS t
WHERE t.name = :name AND t.`key` = :key AND t.shard = 0

-- name: TakeReadOK
-- TakeRead without the clock, which RETURNING gave: what the statement with
-- RETURNING did, read after the connection's first call.
SELECT t.value, t.ts, CAST(@txlimit_ok AS SIGNED) AS ok
FROM txlimit AS t
WHERE t.name = :name AND t.`key` = :key AND t.shard = 0
