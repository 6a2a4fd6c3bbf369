-- txlimit: the state of every rate limit, one row per (name, key, shard).
-- A row that does not exist is a full limit, so rows may be deleted once
-- they have refilled.

-- +goose Up
CREATE TABLE txlimit (
    name  text             NOT NULL,
    key   text             NOT NULL,
    shard integer          NOT NULL CHECK (shard >= 0),
    value double precision NOT NULL,
    ts    timestamptz      NOT NULL,
    PRIMARY KEY (name, key, shard)
);

-- +goose Down
DROP TABLE txlimit;
