package migrations_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

func sqliteDB(t *testing.T) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func postgresDB(t *testing.T) *sql.DB {
	// A fresh schema with no migrations.
	pool := testdb.Pool(t, testdb.EmptySchema(t), pgx.QueryExecModeCacheStatement, 2)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestUpDownAndVersionTable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		dialect migrations.Dialect
		open    func(*testing.T) *sql.DB
		goose   goose.Dialect
		version int64
	}{
		{migrations.SQLite, sqliteDB, goose.DialectSQLite3, 5},       // 2: the sliding window's prev, 3: txlimit_holder, 4: paused_until, 5: txlimit_idempotency
		{migrations.Postgres, postgresDB, goose.DialectPostgres, 12}, // 2: escrow mode's tables, 3: the arithmetic's functions, 4: prev, 5: txlimit_deny, 6: fillfactor, 7: no shard checks, 8: escrow's tables settled and dropped, 9: shards and the lean takes' functions, 10: txlimit_holder, 11: paused_until, 12: txlimit_idempotency
	} {
		t.Run(string(tc.dialect), func(t *testing.T) {
			db := tc.open(t)
			// The application's own goose history, in goose's default table.
			_, err := db.ExecContext(ctx, "CREATE TABLE goose_db_version (id integer, version_id bigint, is_applied boolean)")
			require.NoError(t, err)

			require.NoError(t, migrations.Up(ctx, db, tc.dialect))
			require.NoError(t, migrations.Up(ctx, db, tc.dialect), "Up is idempotent")
			_, err = db.ExecContext(ctx, "INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('n', 'k', 0, 1, 0)")
			if tc.dialect == migrations.Postgres {
				_, err = db.ExecContext(ctx, "INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('n', 'k', 0, 1, now())")
			}
			require.NoError(t, err)
			var n int
			require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM goose_db_version").Scan(&n))
			require.Zero(t, n, "the application's goose table is untouched")

			p, err := migrations.Provider(db, tc.dialect)
			require.NoError(t, err)
			v, err := p.GetDBVersion(ctx)
			require.NoError(t, err)
			require.Equal(t, tc.version, v)
			_, err = p.DownTo(ctx, 0)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, "SELECT 1 FROM txlimit")
			require.Error(t, err, "down drops the table")

			// The files work as plain goose migrations in the app's history.
			fsys, err := migrations.FS(tc.dialect)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, "DROP TABLE goose_db_version")
			require.NoError(t, err)
			plain, err := goose.NewProvider(tc.goose, db, fsys)
			require.NoError(t, err)
			_, err = plain.Up(ctx)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, "SELECT 1 FROM txlimit")
			require.NoError(t, err)
			if tc.dialect == migrations.Postgres {
				var escrow bool
				require.NoError(t, db.QueryRowContext(ctx, "SELECT to_regclass('txlimit_escrow') IS NOT NULL OR to_regclass('txlimit_escrow_claim') IS NOT NULL").Scan(&escrow))
				require.False(t, escrow, "00008 dropped escrow mode's tables")
				var fits bool
				require.NoError(t, db.QueryRowContext(ctx, "SELECT txlimit_fits(txlimit_bucket_refill(0, 1000000, 1, 1000000, 5) - 1, 5)").Scan(&fits))
				require.True(t, fits, "one second of a token a second refills one token")
			}
		})
	}
}

func TestUnknownDialect(t *testing.T) {
	_, err := migrations.FS("oracle")
	require.ErrorContains(t, err, "migrations.Postgres, migrations.SQLite or migrations.MySQL")
	require.Error(t, migrations.Up(context.Background(), sqliteDB(t), "oracle"))
}
