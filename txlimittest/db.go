package txlimittest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// setupTimeout bounds the database work of SQLite, PostgresSchema and their
// cleanups.
const setupTimeout = time.Minute

// sqliteDSN holds the settings package sqlitestore documents: wait for the
// write lock (busy_timeout), readers beside the writer (WAL), and the write
// lock taken at BEGIN (_txlock=immediate).
const sqliteDSN = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// SQLite returns a limiter with limits and opts (opts may be nil) on a new
// SQLite database, and that database, for one test: a file in a temporary
// directory, migrated with migrations.Up, opened with the settings package
// sqlitestore documents (busy_timeout, WAL, _txlock=immediate, so that
// db.Begin takes the write lock at once). Create the application's own
// tables in it, and run the code under test on it: LimitTx takes any
// transaction of db. The database is closed and its directory removed when
// t ends; a failure to set it up ends the test.
//
// Pass &txlimit.Options{Clock: clock.Now} with a Clock for a test whose
// numbers must not depend on the time it runs.
func SQLite(t testing.TB, limits map[string]txlimit.Config, opts *txlimit.Options) (*txlimit.Limiter[*sql.Tx], *sql.DB) {
	t.Helper()
	dir, err := os.MkdirTemp("", "txlimittest-")
	if err != nil {
		t.Fatalf("txlimittest.SQLite: %v", err)
	}
	// Registered first, so that it runs after db.Close (cleanups run last
	// in, first out).
	t.Cleanup(func() { removeDir(t, dir) })
	connector, err := sqlite.NewConnector("file:" + filepath.Join(dir, "txlimit.db") + sqliteDSN)
	if err != nil {
		t.Fatalf("txlimittest.SQLite: %v", err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("txlimittest.SQLite: close the database: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		t.Fatalf("txlimittest.SQLite: %v", err)
	}
	l, err := txlimit.New(sqlitestore.New(db), limits, opts)
	if err != nil {
		t.Fatalf("txlimittest.SQLite: txlimit.New: %v", err)
	}
	return l, db
}

// removeDir removes dir, trying again for a couple of seconds. t.TempDir's
// removal is not used: it fails the test on a directory that is not empty
// yet, and SQLite may still create or delete its -wal, -shm or -journal
// file as the last connection closes (sqlitestore prepares its statements
// on a connection of the pool in the background, which db.Close does not
// wait for).
func removeDir(t testing.TB, dir string) {
	var err error
	for range 100 {
		if err = os.RemoveAll(dir); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("txlimittest.SQLite: remove %s: %v", dir, err)
}

// PostgresSchema creates a schema of its own for one test on pool's server,
// runs txlimit's migrations (migrations.Up) in it, and returns a new pool
// whose connections have that schema first in their search_path, followed
// by pool's own search_path: txlimit's tables, and any table the test
// creates through the new pool, are the test's own, while the application's
// tables in pool's schemas stay visible. The new pool has pool's
// configuration otherwise (exec mode, MaxConns, hooks). When t ends, the
// new pool is closed and the schema dropped, through pool, which must stay
// open until then. A failure to set it up ends the test.
//
// Build the limiter on it with pgstore.New(schemaPool); or call Postgres,
// which does. For pgsqlstore (database/sql), open a *sql.DB on it with
// github.com/jackc/pgx/v5/stdlib:
//
//	db := stdlib.OpenDBFromPool(txlimittest.PostgresSchema(t, pool))
//	limiter, err := txlimit.New(pgsqlstore.New(db), limits, &txlimit.Options{Clock: clock.Now})
//
// An application on another database/sql driver (lib/pq) can do the same in
// its tests, since LimitTx takes a *sql.Tx of any driver, or open its own
// *sql.DB with the schema in the DSN's search_path (SELECT current_schema()
// on the new pool names it).
//
// The schema's name starts with "txlimittest_". Tests that each call
// PostgresSchema may run in parallel: their limits never share a row.
func PostgresSchema(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	var searchPath string
	if err := pool.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&searchPath); err != nil {
		t.Fatalf("txlimittest.PostgresSchema: read the search_path: %v", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := "txlimittest_" + hex.EncodeToString(b)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("txlimittest.PostgresSchema: %v", err)
	}
	// Registered before the new pool's Close, so that it runs after it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("txlimittest.PostgresSchema: drop schema %s: %v", schema, err)
		}
	})
	if err := migrate(ctx, pool.Config(), schema); err != nil {
		t.Fatalf("txlimittest.PostgresSchema: schema %s: %v", schema, err)
	}
	if strings.TrimSpace(searchPath) != "" {
		searchPath = schema + ", " + searchPath
	} else {
		searchPath = schema
	}
	p, err := newPool(ctx, pool.Config(), searchPath)
	if err != nil {
		t.Fatalf("txlimittest.PostgresSchema: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// migrate runs migrations.Up in schema on a short-lived pool of cfg's
// server whose search_path is schema alone, so that goose's tables land
// there too. It has two connections whatever cfg's MaxConns: goose renews
// its lock on one while the migrations run on the other.
func migrate(ctx context.Context, cfg *pgxpool.Config, schema string) error {
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 2, 0, 0
	p, err := newPool(ctx, cfg, schema)
	if err != nil {
		return err
	}
	defer p.Close()
	db := stdlib.OpenDBFromPool(p)
	defer db.Close()
	return migrations.Up(ctx, db, migrations.Postgres)
}

func newPool(ctx context.Context, cfg *pgxpool.Config, searchPath string) (*pgxpool.Pool, error) {
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Postgres returns a limiter with limits and opts (opts may be nil) on a
// schema of its own for one test (PostgresSchema), and the pool on that
// schema, through which the test runs the code under test. A failure to set
// it up ends the test.
func Postgres(t testing.TB, pool *pgxpool.Pool, limits map[string]txlimit.Config, opts *txlimit.Options) (*txlimit.Limiter[pgx.Tx], *pgxpool.Pool) {
	t.Helper()
	p := PostgresSchema(t, pool)
	l, err := txlimit.New(pgstore.New(p), limits, opts)
	if err != nil {
		t.Fatalf("txlimittest.Postgres: txlimit.New: %v", err)
	}
	return l, p
}
