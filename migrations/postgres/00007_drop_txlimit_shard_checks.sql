-- The shard >= 0 checks of 00001 and 00002 go. PostgreSQL rebuilds a
-- table's CHECK expressions from the catalog at the start of every
-- statement that writes it, so each take paid for the check's parse and
-- set-up: about 14k of the 270k instructions the server runs for a
-- transaction with one take (BenchmarkServerInstructions). Only txlimit
-- writes these tables, and its shard numbers come from the Limiter's own
-- arithmetic (0 to Shards-1), checked on the Go side before any write. The
-- NOT NULL constraints stay: they cost nothing of the kind. IF EXISTS,
-- because CockroachDB names a CHECK differently; where it does not match,
-- the check stays and costs what it did.

-- +goose Up
ALTER TABLE txlimit DROP CONSTRAINT IF EXISTS txlimit_shard_check;
ALTER TABLE txlimit_escrow DROP CONSTRAINT IF EXISTS txlimit_escrow_shard_check;

-- +goose Down
ALTER TABLE txlimit ADD CONSTRAINT txlimit_shard_check CHECK (shard >= 0);
ALTER TABLE txlimit_escrow ADD CONSTRAINT txlimit_escrow_shard_check CHECK (shard >= 0);
