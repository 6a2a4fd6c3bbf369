-- The one-statement takes (queries/postgres: TakeBucket, TakeWindow,
-- TakeBucketReserve, TakeWindowReserve) made leaner, measured by the
-- instructions the server runs for them (tools/pgcommitexp -cg,
-- BenchmarkServerInstructions): PostgreSQL builds every expression of a
-- statement anew at each execution, so each operation a take names costs it
-- on every call, evaluated or not.
--
-- txlimit.shards is the number of shards of the layout a row belongs to: 1
-- for an unsharded limit, n on each of the rows 0..n-1 of a limit of n
-- shards. The one-statement takes (which serve shard 0 of an unsharded
-- limit alone) leave a key with shards > 1 to the stores' Go path, which
-- pools its rows (a limit whose Shards was lowered), by testing a column of
-- the row they already hold; they used to look for rows beyond shard 0 in a
-- subquery of their own, which PostgreSQL set up anew at every take: about
-- 25k of the 260k instructions the server runs for a business transaction
-- with a take at commit (tools/pgcommitexp). The sharded fast path
-- (TryLockShard, WaitShard) reads the layout from the row it locks, where
-- it looked for the highest shard of the key in a subquery of its own.
--
-- The statements keep it: those that create rows (InsertShards, InsertKeys,
-- InsertKeyShards) create them with the layout's count, WriteKeyShards
-- writes it on the rows of the layout it writes, and WriteShard, which
-- writes the one row of an unsharded limit while the rows beyond it are
-- deleted, writes 1. A key never has rows beyond shard 0 without its shard
-- 0 (rows are created 0 to Shards-1 in one statement, and deleted all of a
-- key or only beyond the new Shards), so a take that finds no shard 0
-- creates it.
--
-- The keys written before are counted here. A binary of an earlier version
-- creates rows with the default, 1: do not lower a limit's Shards to 1 in
-- the same rolling deploy that runs this migration, or the one-statement
-- take could serve shard 0 of a layout such a binary created. (A sharded
-- limit reads 1 as a layout to reshard, which its next write corrects.)

-- The functions below are algo's arithmetic in the forms the lean takes
-- use, beside those of 00003 (which escrow's statements keep using): the
-- gain of a bucket with its period already a float8 (the store passes
-- float64(Period), the same rounding as a CAST, so the statement spares
-- the cast), and the window's new start from the row's time with the
-- elapsed time named once, so that a caller may pass an expensive one and
-- the function is still inlined. Like 00003's, each is LANGUAGE sql, one
-- SELECT, IMMUTABLE or STABLE, every parameter used once: PostgreSQL
-- inlines them.

-- +goose Up
ALTER TABLE txlimit ADD COLUMN shards integer NOT NULL DEFAULT 1;
UPDATE txlimit AS t SET shards = m.top + 1
FROM (SELECT name, key, max(shard) AS top FROM txlimit GROUP BY name, key HAVING max(shard) > 0) AS m
WHERE t.name = m.name AND t.key = m.key;

-- The microseconds from ts to clock, negative when the clock is behind.
CREATE FUNCTION txlimit_elapsed(clock timestamptz, ts timestamptz)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CAST(extract(epoch FROM clock - ts) * 1000000 AS bigint)
$$;

-- What a token bucket gains over elapsed: algo.Project's
-- float64(elapsed)*Rate/float64(Period), nothing when time ran backwards.
CREATE FUNCTION txlimit_bucket_gain(elapsed bigint, rate float8, period float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CAST(greatest(elapsed, 0) AS float8) * rate / period
$$;

-- What a fixed window gains over elapsed: rate per whole period passed.
CREATE FUNCTION txlimit_window_gain(elapsed bigint, rate float8, period bigint)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT rate * CAST(greatest(elapsed, 0) / period AS float8)
$$;

-- algo.Project's time for a fixed window: ts moved on by the whole periods
-- elapsed, the start of the window the clock is in (00003's
-- txlimit_window_ts, with elapsed named once).
CREATE FUNCTION txlimit_window_start(ts timestamptz, elapsed bigint, period bigint)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT ts + (greatest(elapsed, 0) / period * period) * interval '1 microsecond'
$$;

-- 00003's txlimit_wait_bounded with the period a float8.
CREATE FUNCTION txlimit_wait_short(left_over float8, rate float8, period float8, elapsed bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (-left_over / rate + 2) * period + CAST(greatest(-elapsed, 0) AS float8) < 2e15
$$;

-- +goose Down
DROP FUNCTION txlimit_wait_short(float8, float8, float8, bigint);
DROP FUNCTION txlimit_window_start(timestamptz, bigint, bigint);
DROP FUNCTION txlimit_window_gain(bigint, float8, bigint);
DROP FUNCTION txlimit_bucket_gain(bigint, float8, float8);
DROP FUNCTION txlimit_elapsed(timestamptz, timestamptz);
ALTER TABLE txlimit DROP COLUMN shards;
