package txlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testdb"
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
				name := uniqueName(t, "pgbouncer")
				l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
					name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour},
				}, &txlimit.Options{Clock: func() time.Time { return frozen }})
				require.NoError(t, err)

				requireExactAdmission(t, l, name, clients, calls, capacity, func() (res txlimit.Result, err error) {
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

// requireExactAdmission runs clients goroutines, each making calls calls of
// call, and requires that no call errs, that exactly capacity of them are
// granted, and that limit name of l holds nothing afterwards.
func requireExactAdmission[TTx any](t *testing.T, l *txlimit.Limiter[TTx], name string, clients, calls, capacity int, call func() (txlimit.Result, error)) {
	t.Helper()
	var granted, denied atomic.Int64
	errs := make(chan error, clients*calls)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range calls {
				res, err := call()
				switch {
				case err != nil:
					errs <- err
				case res.OK:
					granted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, capacity, granted.Load())
	require.EqualValues(t, clients*calls-capacity, denied.Load())
	snap, err := l.Value(context.Background(), name, "k")
	require.NoError(t, err)
	require.Zero(t, snap.Value)
}
