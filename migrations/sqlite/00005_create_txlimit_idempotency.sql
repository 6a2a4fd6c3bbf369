-- txlimit_idempotency: the idempotency keys of takes (txlimit.Idempotent),
-- one row per key: the request it was first used for and that call's
-- result, until expires_at (microseconds since the Unix epoch: the store's
-- clock when the call claimed it, plus its window). A call writes its
-- key's row before it takes, which takes the write lock: a repeat in
-- another transaction waits for it, and then reads the result it wrote
-- (or, when it rolled back, writes the row itself). A row whose result is
-- NULL, or that has expired, is the key unused: the next call with the key
-- takes it over. Prune deletes expired rows, in the order of the index on
-- expires_at.

-- +goose Up
CREATE TABLE txlimit_idempotency (
    id         TEXT    NOT NULL PRIMARY KEY,
    request    TEXT    NOT NULL,
    result     TEXT,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX txlimit_idempotency_expires_at ON txlimit_idempotency (expires_at);

-- +goose Down
DROP TABLE txlimit_idempotency;
