-- txlimit: the state of every rate limit, one row per (name, key, shard).
-- A row that does not exist is a full limit, so rows may be deleted once
-- they have refilled. ts is microseconds since the Unix epoch, so that
-- comparisons are exact.

-- +goose Up
CREATE TABLE txlimit (
    name  TEXT    NOT NULL,
    key   TEXT    NOT NULL,
    shard INTEGER NOT NULL CHECK (shard >= 0),
    value REAL    NOT NULL,
    ts    INTEGER NOT NULL,
    PRIMARY KEY (name, key, shard)
) WITHOUT ROWID;

-- +goose Down
DROP TABLE txlimit;
