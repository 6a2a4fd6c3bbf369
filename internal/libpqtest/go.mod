module github.com/txlimit/txlimit/internal/libpqtest

go 1.26.0

require github.com/lib/pq v1.12.3
