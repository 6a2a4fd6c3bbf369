-- txlimit_idempotency: the idempotency keys of takes (txlimit.Idempotent),
-- one row per key: the request it was first used for and that call's
-- result, until expires_at (the server's UTC clock, as txlimit.ts, when the
-- call claimed it, plus its window). The primary key is the unique
-- constraint a repeat runs into: a call inserts or locks its key's row with
-- INSERT … ON DUPLICATE KEY UPDATE (an exclusive lock on the row, never a
-- shared lock to upgrade) before it takes, in the take's transaction, so
-- that a concurrent repeat waits for that transaction and then reads the
-- result it wrote (or, when it rolled back, inserts the row itself). A row
-- whose result is NULL, or that has expired, is the key unused: the next
-- call with the key takes it over. Prune deletes expired rows, found
-- through the index on expires_at.
--
-- id is VARBINARY, compared byte by byte; at most 256 bytes (the library
-- checks). request and result are the library's own text. One DDL
-- statement per migration, as in 00001.

-- +goose Up
CREATE TABLE txlimit_idempotency (
    id         VARBINARY(256) NOT NULL,
    request    MEDIUMBLOB     NOT NULL,
    result     MEDIUMBLOB,
    expires_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (id),
    INDEX txlimit_idempotency_expires_at (expires_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- +goose Down
DROP TABLE txlimit_idempotency;
