package promobserver_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit/migrations"
)

// The databases the tests run on: a SQLite file in the test's temp dir, and
// PostgreSQL from TEST_DATABASE_URL or the local server DEVELOPERS.md sets
// up, in a schema of the test's own. Without PostgreSQL the tests skip,
// loudly, except under CI=true, where they fail.

const localDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const sqliteDSN = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// openSQLite opens a new SQLite file, with txlimit's table when migrate.
func openSQLite(t *testing.T, migrate bool) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "txlimit.db")+sqliteDSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	if migrate {
		require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	}
	return db
}

// closedSQLite returns a migrated database that is already closed.
func closedSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db := openSQLite(t, true)
	require.NoError(t, db.Close())
	return db
}

// closedPostgres returns a pool on a migrated schema that is already closed.
func closedPostgres(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := openPostgres(t, true)
	pool.Close()
	return pool
}

// openPostgres returns a pool whose search_path is a new schema, dropped at
// the end of the test, with txlimit's table when migrate.
func openPostgres(t *testing.T, migrate bool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), localDatabaseURL)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING PostgreSQL tests: no server at %s: %v (set TEST_DATABASE_URL or start a local server)", url, err)
	}
	defer admin.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_test_" + hex.EncodeToString(b)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if migrate {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		require.NoError(t, migrations.Up(ctx, db, migrations.Postgres))
	}
	return pool
}

// frozen is a clock that stands still, so that no token refills during a
// test and every count is exact.
func frozen() func() time.Time {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return func() time.Time { return at }
}
