-- txlimit's arithmetic in SQL, written once: the statements of
-- queries/postgres that refill, decide and write a row in one statement
-- (TakeBucket, TakeWindow and TakeReserve in the caller's transaction, the
-- escrow debits) call these functions. Each is the algo rule it names,
-- operation for operation, in float8 and in bigint microseconds, so that a
-- row written in SQL is bit for bit the row algo computes (differential
-- tests in pgstore hold every statement to algo).
--
-- They are LANGUAGE sql functions of one SELECT, IMMUTABLE or STABLE, with
-- no SET clause and no SECURITY DEFINER, so that PostgreSQL inlines them
-- into the calling statement: a call costs what its expression costs
-- written out (BenchmarkServerInstructions counts it). Two rules keep them
-- inlined and cheap. A parameter used more than once in a body must be
-- given a cheap argument (a column, a parameter, an elapsed time): with an
-- expensive one PostgreSQL calls the function instead, which costs far more.
-- And a statement pays for the size of its expressions at every execution
-- (the executor compiles them anew), so the lean statements use the
-- functions of their own kind, without a test of kind.
--
-- kind is algo.Kind: 1 token bucket, 2 fixed window. elapsed is the clock
-- minus the row's time, in microseconds, negative when the clock stepped
-- back; left_over is the value after a take (the refilled value minus the
-- count). Bodies have no line ending in a semicolon, so that goose reads
-- each CREATE FUNCTION as one statement without StatementBegin.

-- +goose Up
-- algo.Project's value for a token bucket: rate per period, continuously,
-- capped at capacity; time running backwards adds nothing (v + 0 is v).
CREATE FUNCTION txlimit_bucket_refill(value float8, elapsed bigint, rate float8, period bigint, capacity float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(value + CAST(greatest(elapsed, 0) AS float8) * rate / CAST(period AS float8), capacity)
$$;

-- algo.Project's time for a token bucket: the clock, never backwards.
CREATE FUNCTION txlimit_bucket_ts(ts timestamptz, clock timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(ts, clock)
$$;

-- algo.Project's value for a fixed window: rate per whole period passed.
CREATE FUNCTION txlimit_window_refill(value float8, elapsed bigint, rate float8, period bigint, capacity float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(value + rate * CAST(greatest(elapsed, 0) / period AS float8), capacity)
$$;

-- algo.Project's time for a fixed window: the start of the window the
-- clock is in, once a whole period has passed.
CREATE FUNCTION txlimit_window_ts(ts timestamptz, clock timestamptz, elapsed bigint, period bigint)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN elapsed < period THEN ts ELSE clock - (elapsed % period) * interval '1 microsecond' END
$$;

-- algo.Project's value for either kind.
CREATE FUNCTION txlimit_refill(kind integer, value float8, elapsed bigint, rate float8, period bigint, capacity float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN kind = 2 THEN txlimit_window_refill(value, elapsed, rate, period, capacity)
                ELSE txlimit_bucket_refill(value, elapsed, rate, period, capacity) END
$$;

-- algo.Project's time for either kind.
CREATE FUNCTION txlimit_refill_ts(kind integer, ts timestamptz, clock timestamptz, elapsed bigint, period bigint)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN kind = 2 THEN txlimit_window_ts(ts, clock, elapsed, period)
                ELSE txlimit_bucket_ts(ts, clock) END
$$;

-- algo.TakeShards' test that what a take leaves is no debt: at least zero
-- within algo's tolerance, 1e-9 of the capacity (at least 1e-9), which
-- absorbs floating-point rounding.
CREATE FUNCTION txlimit_fits(left_over float8, capacity float8)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left_over >= -1e-9::float8 * greatest(1, capacity)
$$;

-- The value a grant that fits leaves: what is left, floored at zero (the
-- tolerance never leaves a debt; greatest keeps +0 where left_over is -0,
-- as algo's x > 0 test does).
CREATE FUNCTION txlimit_kept(left_over float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(left_over, 0)
$$;

-- algo.TakeShards' cap on a reservation's debt: none when max_reserved is
-- 0, else the debt within max_reserved (within the tolerance).
CREATE FUNCTION txlimit_within_debt(left_over float8, capacity float8, max_reserved float8)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT max_reserved = 0 OR txlimit_fits(left_over + max_reserved, capacity)
$$;

-- Whether a reservation's wait is surely below 2e15 µs (63 years), a bound
-- from above in float operations that the differential tests repeat: a
-- longer one is left to the stores' Go path, which refuses waits a
-- Decision cannot hold (algo.MaxWait).
CREATE FUNCTION txlimit_wait_bounded(left_over float8, rate float8, period bigint, elapsed bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (-left_over / rate + 2) * CAST(period AS float8) + CAST(greatest(-elapsed, 0) AS float8) < 2e15
$$;

-- +goose Down
DROP FUNCTION txlimit_wait_bounded(float8, float8, bigint, bigint);
DROP FUNCTION txlimit_within_debt(float8, float8, float8);
DROP FUNCTION txlimit_kept(float8);
DROP FUNCTION txlimit_fits(float8, float8);
DROP FUNCTION txlimit_refill_ts(integer, timestamptz, timestamptz, bigint, bigint);
DROP FUNCTION txlimit_refill(integer, float8, bigint, float8, bigint, float8);
DROP FUNCTION txlimit_window_ts(timestamptz, timestamptz, bigint, bigint);
DROP FUNCTION txlimit_window_refill(float8, bigint, float8, bigint, float8);
DROP FUNCTION txlimit_bucket_ts(timestamptz, timestamptz);
DROP FUNCTION txlimit_bucket_refill(float8, bigint, float8, bigint, float8);
