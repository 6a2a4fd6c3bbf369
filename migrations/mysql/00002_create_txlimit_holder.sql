-- txlimit_holder: the holders of concurrency limits (txlimit.Concurrency),
-- one row per holder of a slot of (name, key), with the instant it expires
-- (the server's UTC clock, as txlimit.ts). Live holders (expires_at after
-- the clock) are counted, never positions.
--
-- The row whose holder is '' is the key's lock row, never counted: every
-- acquire creates or locks it with INSERT … ON DUPLICATE KEY UPDATE (which
-- locks the row by its primary key, and no gap) before it reads the key's
-- holders with a locking read (which sees the latest committed rows under
-- REPEATABLE READ too), so that two transactions never both count
-- Capacity-1 and both insert (write skew). Its expires_at is the latest of
-- the key's holders', so that Prune may delete it once that has passed.
--
-- name, key and holder are VARBINARY, compared byte by byte as txlimit's
-- are; holder ids are at most 256 bytes (the library checks), so the
-- primary key is at most 256 + 2048 + 256 bytes, under InnoDB's 3072.
-- One DDL statement per migration, as in 00001.

-- +goose Up
CREATE TABLE txlimit_holder (
    name       VARBINARY(256)  NOT NULL,
    `key`      VARBINARY(2048) NOT NULL,
    holder     VARBINARY(256)  NOT NULL,
    expires_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (name, `key`, holder)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- +goose Down
DROP TABLE txlimit_holder;
