-- txlimit: the state of every rate limit, one row per (name, key, shard), for
-- MySQL 8.0.19+ and MariaDB 10.6+ (InnoDB). A row that does not exist is a
-- full limit, so rows may be deleted once they have refilled.
--
-- name and key are VARBINARY: they compare byte by byte whatever the
-- server's or the connection's character set, as Go compares strings, which
-- is the canonical order LimitAll locks in; no character set can refuse a
-- 4-byte UTF-8 key (utf8mb3 would) and no PAD SPACE collation can make 'k'
-- and 'k ' one row. Their lengths are txlimit.MaxNameLen and
-- txlimit.MaxKeyLen in bytes, which the limiter enforces before a call
-- reaches the store: the primary key is then at most 256 + 2048 + 4 = 2308
-- bytes, under InnoDB's 3072 for the DYNAMIC row format (a utf8mb4
-- VARCHAR(2048) would need 8192). ts is the server's UTC clock
-- (UTC_TIMESTAMP(6)) at microsecond precision; DATETIME rather than
-- TIMESTAMP, which the server would convert through the session's
-- time_zone and which ends in 2038 on MySQL.
--
-- One DDL statement per migration: MySQL commits DDL at once, so a file with
-- two statements that failed in the second would be half applied.

-- +goose Up
CREATE TABLE txlimit (
    name  VARBINARY(256)  NOT NULL,
    `key` VARBINARY(2048) NOT NULL,
    shard INT             NOT NULL,
    value DOUBLE          NOT NULL,
    -- The previous window's count of a sliding window (algo.State.Prev);
    -- 0 for every other kind.
    prev  DOUBLE          NOT NULL DEFAULT 0,
    ts    DATETIME(6)     NOT NULL,
    PRIMARY KEY (name, `key`, shard),
    CONSTRAINT txlimit_shard_nonnegative CHECK (shard >= 0)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- +goose Down
DROP TABLE txlimit;
