package pgsqltest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// ThroughPgBouncer is pgstore's TestLimitThroughPgBouncer for pgsqlstore:
// 16 clients against one limit through a real PgBouncer in transaction
// mode with two server connections, with each of drivers but pgx's in
// cache_statement mode (lib/pq runs each statement with parameters as an
// unnamed prepared statement, inside the transaction's server connection).
// The sharded case runs the savepoints of the SKIP LOCKED fast path through
// the pooler.
func ThroughPgBouncer(t *testing.T, drivers []Driver) {
	testdb.NeedPgBouncer(t)
	dbName, direct := testdb.Database(t, "txlimit_pgbouncer")
	admin, err := pgxpool.New(context.Background(), direct)
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, migrations.Up(context.Background(), stdlib.OpenDBFromPool(admin), migrations.Postgres))
	bouncer := testdb.PgBouncer(t, dbName, "transaction", 2)

	const clients, calls, capacity = 16, 10, 100
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, d := range drivers {
		if d.Mode == "cache_statement" {
			continue // named prepared statements per server connection: 42P05 through the pooler
		}
		for _, c := range []struct {
			inTx   bool
			shards int
		}{{true, 1}, {false, 1}, {true, 4}} {
			inTx := c.inTx
			t.Run(fmt.Sprintf("%s/tx=%v/shards=%d", d.Label, inTx, c.shards), func(t *testing.T) {
				db, err := sql.Open(d.Name, withParams(t, bouncer, d.params()))
				require.NoError(t, err)
				defer db.Close()
				db.SetMaxOpenConns(clients)
				db.SetMaxIdleConns(clients)
				name := storetest.UniqueName(t, "pgbouncer")
				l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
					name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: c.shards},
				}, &txlimit.Options{Clock: func() time.Time { return frozen }})
				require.NoError(t, err)
				require.NoError(t, l.Ping(context.Background()))

				storetest.RequireExactAdmission(t, l, name, clients, calls, capacity, func() (res txlimit.Result, err error) {
					if !inTx {
						return l.Limit(context.Background(), name, "k")
					}
					tx, err := db.BeginTx(context.Background(), nil)
					if err != nil {
						return res, err
					}
					defer func() { _ = tx.Rollback() }()
					if res, err = l.LimitTx(context.Background(), tx, name, "k"); err != nil {
						return res, err
					}
					return res, tx.Commit()
				})
			})
		}
	}
}
