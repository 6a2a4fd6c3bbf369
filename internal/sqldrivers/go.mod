module github.com/txlimit/txlimit/internal/sqldrivers

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/lib/pq v1.12.3
	github.com/stretchr/testify v1.12.1
	github.com/txlimit/txlimit v0.0.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

replace github.com/txlimit/txlimit => ../..
