package migrations_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// The migration that adds paused_until runs on a table the version before
// it wrote: no key is paused, every row decides as before, a pause then
// works, and rolling it back keeps the rows.
func TestUpgradeAddsPausedUntil(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limits := map[string]txlimit.Config{"bucket": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 20}}
	ts := at.Add(-3 * time.Second) // 3.5 tokens then, 4 now
	for _, tc := range []struct {
		dialect migrations.Dialect
		before  int64 // the last version before paused_until
		open    func(*testing.T) *sql.DB
		insert  string
		tsArg   any
		store   func(*sql.DB) driver.Store[*sql.Tx]
	}{
		{migrations.SQLite, 3, sqliteDB, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('bucket', 'k', 0, 3.5, ?)`,
			ts.UnixMicro(), func(db *sql.DB) driver.Store[*sql.Tx] { return sqlitestore.New(db) }},
		{migrations.Postgres, 10, func(t *testing.T) *sql.DB {
			pool := testdb.Pool(t, testdb.EmptySchema(t), pgx.QueryExecModeCacheStatement, 4)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('bucket', 'k', 0, 3.5, $1)`,
			ts, func(db *sql.DB) driver.Store[*sql.Tx] { return pgsqlstore.New(db) }},
	} {
		t.Run(string(tc.dialect), func(t *testing.T) {
			db := tc.open(t)
			p, err := migrations.Provider(db, tc.dialect)
			require.NoError(t, err)
			_, err = p.UpTo(ctx, tc.before)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, tc.insert, tc.tsArg)
			require.NoError(t, err)
			l, err := txlimit.New(tc.store(db), limits, &txlimit.Options{Clock: func() time.Time { return at }})
			require.NoError(t, err)
			require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated, "the version before lacks paused_until")

			require.NoError(t, migrations.Up(ctx, db, tc.dialect))
			require.NoError(t, l.Ping(ctx))
			var paused int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM txlimit WHERE paused_until IS NOT NULL").Scan(&paused))
			require.Zero(t, paused)
			res, err := l.Limit(ctx, "bucket", "k", txlimit.Count(4))
			require.NoError(t, err)
			require.True(t, res.OK, "%+v", res)
			require.Zero(t, res.Remaining)

			require.NoError(t, l.Pause(ctx, "bucket", "k", at.Add(time.Minute)))
			res, err = l.Check(ctx, "bucket", "k", txlimit.Count(0))
			require.NoError(t, err)
			require.True(t, res.Paused)
			require.Equal(t, time.Minute, res.RetryAfter)

			// Down drops the column and keeps the rows (and so drops the
			// pause): the version before decides on them as it did.
			_, err = p.DownTo(ctx, tc.before)
			require.NoError(t, err)
			var rows int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM txlimit WHERE name = 'bucket' AND key = 'k'").Scan(&rows))
			require.Equal(t, 1, rows)
			require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated)
		})
	}
}
