-- txlimit.paused_until: the instant until which a key is paused
-- (Limiter.Pause), in UTC like ts, on every row of the key; NULL for none,
-- which is what the rows written before read as. Every take, check and wait
-- on a key whose paused_until lies after the clock is denied until then,
-- and Prune keeps its rows. The one-statement take leaves a row with a
-- paused_until to the Go path, which clears one that has ended when it
-- writes the key. One DDL statement (see 00001).

-- +goose Up
ALTER TABLE txlimit ADD COLUMN paused_until DATETIME(6) NULL;

-- +goose Down
ALTER TABLE txlimit DROP COLUMN paused_until;
