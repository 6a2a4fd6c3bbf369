-- txlimit_holder: the holders of concurrency limits (txlimit.Concurrency),
-- one row per holder of a slot of (name, key), with the instant it expires
-- in microseconds since the Unix epoch. Live holders (expires_at after the
-- clock) are counted, never positions. The row whose holder is '' is the
-- key's lock row, never counted: on SQLite the write lock that every
-- acquire takes before it counts already serializes acquirers, and the
-- lock row only keeps the key's latest expiry, for Prune.

-- +goose Up
CREATE TABLE txlimit_holder (
    name       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (name, key, holder)
) WITHOUT ROWID;

-- +goose Down
DROP TABLE txlimit_holder;
