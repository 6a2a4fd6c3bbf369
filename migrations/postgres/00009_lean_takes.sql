-- The one-statement takes (queries/postgres: TakeBucket, TakeWindow,
-- TakeBucketReserve, TakeWindowReserve) made leaner, measured by the
-- instructions the server runs for them (tools/pgcommitexp -cg,
-- BenchmarkServerInstructions): PostgreSQL builds every expression of a
-- statement anew at each execution, so each operation a take names costs it
-- on every call, evaluated or not.
--
-- txlimit.sharded is set on the rows of a key laid out over more than one
-- shard, so that the one-statement takes (TakeBucket and the others, which
-- serve shard 0 of an unsharded limit alone) leave such a key to the
-- stores' Go path, which pools its rows (a limit whose Shards was lowered),
-- by testing a column of the row they already hold. They used to look for
-- rows beyond shard 0 in a subquery of their own, which PostgreSQL set up
-- anew at every take: about 25k of the 260k instructions the server runs
-- for a business transaction with a take at commit (tools/pgcommitexp).
--
-- The rule the statements keep: a key with a row beyond shard 0 has
-- sharded set on its shard 0. The statements that create rows for a
-- layout of several shards (InsertShards, InsertKeys, InsertKeyShards) set
-- it on the rows they create, and WriteKeyShards, which writes such a
-- layout, on the rows it writes; WriteShard, which writes the one row of an
-- unsharded layout while the rows beyond it are deleted, clears it. A key
-- never has rows beyond shard 0 without its shard 0 (rows are created 0 to
-- Shards-1 in one statement, and deleted all of a key or only beyond the
-- new Shards), so a take that finds no shard 0 creates it.
--
-- Keys already laid out over several shards are marked here. A binary of
-- an earlier version that creates a sharded layout after this migration
-- leaves it unmarked: do not lower a limit's Shards to 1 in the same
-- rolling deploy that runs this migration.

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
ALTER TABLE txlimit ADD COLUMN sharded boolean NOT NULL DEFAULT false;
UPDATE txlimit AS t SET sharded = true
WHERE EXISTS (SELECT 1 FROM txlimit AS x WHERE x.name = t.name AND x.key = t.key AND x.shard > 0);

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
ALTER TABLE txlimit DROP COLUMN sharded;
