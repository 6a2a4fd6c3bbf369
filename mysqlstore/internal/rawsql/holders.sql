-- The statements of concurrency limits (txlimit.Concurrency) that sqlc's
-- MySQL engine cannot compile; the others are in queries/mysql/holders.sql.

-- name: DeleteHolderRows
-- Deletes the listed rows of txlimit_holder, which the transaction holds
-- (Prune locked them), by their primary keys: a JSON array of [name, key,
-- holder], each in hexadecimal, as rows.sql's lists.
DELETE h FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(512) PATH '$[0]', k VARCHAR(4096) PATH '$[1]', o VARCHAR(512) PATH '$[2]')) AS j
STRAIGHT_JOIN txlimit_holder AS h FORCE INDEX (PRIMARY)
    ON h.name = UNHEX(j.n) AND h.`key` = UNHEX(j.k) AND h.holder = UNHEX(j.o)
