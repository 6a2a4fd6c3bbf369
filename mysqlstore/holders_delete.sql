-- name: DeleteHolderRows :execrows
-- Deletes the listed rows of txlimit_holder, which the transaction holds,
-- by their primary keys: a JSON array of [name, key, holder], each in hex.
-- Prune's delete (holders.go); bound by hand, since sqlc's MySQL engine
-- does not parse JSON_TABLE.
DELETE h FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', o VARCHAR(512) PATH '$[2]')) AS j
STRAIGHT_JOIN txlimit_holder AS h FORCE INDEX (PRIMARY)
    ON h.name = UNHEX(j.n) AND h.`key` = UNHEX(j.k) AND h.holder = UNHEX(j.o)
