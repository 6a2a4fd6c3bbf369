-- txlimit_idempotency: the idempotency keys of takes (txlimit.Idempotent),
-- one row per key: the request it was first used for and that call's
-- result, until expires_at (the clock of the call that claimed it plus its
-- window). The primary key is the unique constraint a repeat runs into: a
-- call inserts its key's row before it takes, in the take's transaction,
-- so that a concurrent repeat waits for that transaction and then reads
-- the result it wrote (or, when it rolled back, inserts the row itself).
-- A row whose result is NULL, or that has expired, is the key unused: the
-- next call with the key takes it over. Prune deletes expired rows, in the
-- order of the index on expires_at.
--
-- request and result are the library's own text (a description of the
-- request and the JSON of its result); id is at most 256 bytes (the
-- library checks).

-- +goose Up
CREATE TABLE txlimit_idempotency (
    id         text        NOT NULL PRIMARY KEY,
    request    text        NOT NULL,
    result     text,
    expires_at timestamptz NOT NULL
);
CREATE INDEX txlimit_idempotency_expires_at ON txlimit_idempotency (expires_at);

-- +goose Down
DROP TABLE txlimit_idempotency;
