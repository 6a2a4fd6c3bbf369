-- txlimit_holder: the holders of concurrency limits (txlimit.Concurrency),
-- one row per holder of a slot of (name, key), with the instant it expires.
-- Live holders (expires_at after the clock) are counted, never positions.
--
-- The row whose holder is '' is the key's lock row, never counted: every
-- acquire creates it if missing (INSERT … ON CONFLICT, which no concurrent
-- creation can race) and locks it before it counts the key's holders, so
-- that two transactions never both count Capacity-1 and both insert (write
-- skew); an acquire that grants raises the lock row's expires_at to its
-- holder's, so that a REPEATABLE READ transaction that counted a snapshot
-- older than that grant fails to lock it (serialization failure, 40001)
-- rather than admit one holder too many, and so that Prune may delete the
-- lock row once it has passed (no holder of the key is live then).
--
-- holder ids are at most 256 bytes (the library checks), so that a primary
-- key entry stays under PostgreSQL's B-tree limit with the longest name and
-- key. The lock row is updated at every grant: a fillfactor of 90, as
-- txlimit's (00006), keeps those updates HOT.

-- +goose Up
CREATE TABLE txlimit_holder (
    name       text        NOT NULL,
    key        text        NOT NULL,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, key, holder)
) WITH (fillfactor = 90);

-- +goose Down
DROP TABLE txlimit_holder;
