package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// TestLimitThroughPgBouncer runs 16 clients against one limit through a
// real PgBouncer in transaction mode with two server connections, in every
// pgx exec mode that works there, in the caller's transaction (LimitTx) and
// in the limiter's own (Limit): exactly the capacity is granted, and no
// call errs. (pgx's default, QueryExecModeCacheStatement, is left out: its
// named prepared statements are per server connection, and through the
// pooler they fail with 42P05 "prepared statement … already exists" — 140
// of 160 calls in one run here. docs/scale-out.md has the details.)
func TestLimitThroughPgBouncer(t *testing.T) {
	t.Parallel()
	testdb.NeedPgBouncer(t)
	db, direct := testdb.Database(t, "txlimit_pgbouncer")
	admin, err := pgxpool.New(context.Background(), direct)
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, migrations.Up(context.Background(), stdlib.OpenDBFromPool(admin), migrations.Postgres))
	url := testdb.PgBouncer(t, db, "transaction", 2)

	const clients, calls, capacity = 16, 10, 100
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
	} {
		for _, inTx := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/tx=%v", mode, inTx), func(t *testing.T) {
				cfg, err := pgxpool.ParseConfig(url)
				require.NoError(t, err)
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.MaxConns = clients
				pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
				require.NoError(t, err)
				defer pool.Close()
				name := storetest.UniqueName(t, "pgbouncer")
				l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
					name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour},
				}, &txlimit.Options{Clock: func() time.Time { return frozen }})
				require.NoError(t, err)

				storetest.RequireExactAdmission(t, l, name, clients, calls, capacity, func() (res txlimit.Result, err error) {
					if !inTx {
						return l.Limit(context.Background(), name, "k")
					}
					err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
						res, err = l.LimitTx(context.Background(), tx, name, "k")
						return err
					})
					return res, err
				})
			})
		}
	}
}
