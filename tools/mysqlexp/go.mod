module github.com/txlimit/txlimit/tools/mysqlexp

go 1.26.0

replace github.com/txlimit/txlimit => ../..

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/txlimit/txlimit v0.0.0-00010101000000-000000000000
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/pressly/goose/v3 v3.29.0 // indirect
	github.com/sethvargo/go-retry v0.5.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
