-- txlimit.sharded: set on the rows of a key laid out over more than one
-- shard, so that the one-statement takes (TakeBucket and the others, which
-- serve shard 0 of an unsharded limit alone) leave such a key to the
-- stores' Go path, which pools its rows (a limit whose Shards was lowered),
-- by testing a column of the row they already hold. They used to look for
-- rows beyond shard 0 in a subquery of their own, which PostgreSQL set up
-- anew at every take: about 25k of the 260k instructions the server runs
-- for a business transaction with a take at commit (tools/pgcommitexp).
--
-- The rule the statements keep: a key with a row beyond shard 0 has
-- sharded set on its shard 0. The statements that create rows for a
-- layout of several shards (InsertShards, InsertKeys, InsertKeyShards) set
-- it on the rows they create, and WriteKeyShards, which writes such a
-- layout, on the rows it writes; WriteShard, which writes the one row of an
-- unsharded layout while the rows beyond it are deleted, clears it. A key
-- never has rows beyond shard 0 without its shard 0 (rows are created 0 to
-- Shards-1 in one statement, and deleted all of a key or only beyond the
-- new Shards), so a take that finds no shard 0 creates it.
--
-- Keys already laid out over several shards are marked here. A binary of
-- an earlier version that creates a sharded layout after this migration
-- leaves it unmarked: do not lower a limit's Shards to 1 in the same
-- rolling deploy that runs this migration.

-- +goose Up
ALTER TABLE txlimit ADD COLUMN sharded boolean NOT NULL DEFAULT false;
UPDATE txlimit AS t SET sharded = true
WHERE EXISTS (SELECT 1 FROM txlimit AS x WHERE x.name = t.name AND x.key = t.key AND x.shard > 0);

-- +goose Down
ALTER TABLE txlimit DROP COLUMN sharded;
