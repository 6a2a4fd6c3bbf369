-- txlimit.paused_until: the instant until which a key is paused
-- (Limiter.Pause), on every row of the key, NULL for none. Every take,
-- check and wait on a key whose paused_until lies after the clock is
-- denied until then, whatever its tokens, and Prune keeps its rows.
--
-- The one-statement takes (TakeBucket, TakeWindow and their Reserve forms)
-- leave a row whose paused_until is not NULL to the stores' Go path, which
-- decides on it, by a test of the column of the row they already hold: an
-- unpaused key's take pays that test alone. The Go path writes NULL over a
-- pause that has ended when it writes the key, so that its next take is
-- one statement again. The column is NULL on every row written before.

-- +goose Up
ALTER TABLE txlimit ADD COLUMN paused_until timestamptz;

-- +goose Down
ALTER TABLE txlimit DROP COLUMN paused_until;
