-- name: PreparedCount
-- How many statements this connection prepared on the server: Ping's probe
-- of interpolateParams reads it before and after a query with an argument.
-- A SHOW, which sqlc's MySQL engine drops without a word.
SHOW SESSION STATUS LIKE 'Com_stmt_prepare'
