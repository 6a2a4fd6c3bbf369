-- Every take updates its key's row in place. An update stays HOT (the new
-- version on the same page, no new index entry) only when the page has room
-- for it; with the default fillfactor of 100 the pages of a table of many
-- keys are full, and an update that spills to another page also adds an
-- index entry and grows both. A fillfactor of 90 leaves a tenth of each
-- page free for new versions (measured at 1M keys in docs/bench/scale.md:
-- every update HOT, about 5% more bytes a key). It applies to pages
-- written from now on; VACUUM FULL (or pg_repack) applies it to a large
-- existing table.

-- +goose Up
ALTER TABLE txlimit SET (fillfactor = 90);

-- +goose Down
ALTER TABLE txlimit RESET (fillfactor);
