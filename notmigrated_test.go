package txlimit_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// A database without txlimit's table answers every call with an error that
// names migrations.Up, Ping reports it at startup, and FailOpen does not turn
// it into a grant: the limiter is misconfigured, not the database down.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, l interface {
		Ping(context.Context) error
		Limit(context.Context, string, string, ...txlimit.Option) (txlimit.Result, error)
		Check(context.Context, string, string, ...txlimit.Option) (txlimit.Result, error)
	}) {
		for _, err := range []error{
			l.Ping(ctx),
			func() error { _, err := l.Limit(ctx, "l", "k"); return err }(),
			func() error { _, err := l.Check(ctx, "l", "k"); return err }(),
		} {
			require.ErrorIs(t, err, txlimit.ErrNotMigrated)
			require.Contains(t, err.Error(), "migrations.Up")
		}
	}
	limits := map[string]txlimit.Config{"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}
	failOpen := &txlimit.Options{FailOpen: true}

	t.Run("postgres", func(t *testing.T) {
		pool := testdb.Pool(t, "txlimit_not_migrated_"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_")), pgx.QueryExecModeCacheStatement, 2)
		l, err := txlimit.New(pgstore.New(pool), limits, failOpen)
		require.NoError(t, err)
		check(t, l)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, l.Ping(ctx), &pgErr, "the driver's error stays reachable")
		require.Equal(t, "42P01", pgErr.Code)

		migrated := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
		l, err = txlimit.New(pgstore.New(migrated), limits, failOpen)
		require.NoError(t, err)
		require.NoError(t, l.Ping(ctx))
	})
	t.Run("sqlite", func(t *testing.T) {
		db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+testdb.SQLiteDSN)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		l, err := txlimit.New(sqlitestore.New(db), limits, failOpen)
		require.NoError(t, err)
		check(t, l)

		l, err = txlimit.New(sqlitestore.New(testdb.OpenSQLite(t)), limits, failOpen)
		require.NoError(t, err)
		require.NoError(t, l.Ping(ctx))
	})
	t.Run("no pool", func(t *testing.T) {
		l, err := txlimit.New(pgstore.New(nil), limits, nil)
		require.NoError(t, err)
		storetest.RequireNoPool(t, l.Ping(ctx))
	})
}
