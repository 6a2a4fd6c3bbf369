-- txlimit.prev: the count of the previous window of a sliding window
-- (txlimit.SlidingWindow, algo.State.Prev), the third number its state
-- needs. Every other kind leaves it 0, which is what the rows written
-- before this migration read as: no decision of theirs changes. Adding a
-- column with a constant default rewrites no row (PostgreSQL 11 and later).

-- +goose Up
ALTER TABLE txlimit ADD COLUMN prev double precision NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE txlimit DROP COLUMN prev;
