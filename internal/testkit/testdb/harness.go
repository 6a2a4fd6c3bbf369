package testdb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/migrations"
)

// KillQuery ends a connection of the pool it runs on, at random, but not
// the one it runs on: the connections that share its application_name,
// which Pool sets to one of its schema's own (pgsqltest.Open too). A
// connection without one kills nothing.
const KillQuery = `SELECT pg_terminate_backend(pid) FROM (
	SELECT pid FROM pg_stat_activity
	WHERE application_name = current_setting('application_name') AND application_name <> ''
	  AND pid <> pg_backend_pid()
	ORDER BY random() LIMIT 1) AS victim`

// SQLiteDSN is the configuration sqlitestore documents: WAL, a busy timeout
// and BEGIN IMMEDIATE (modernc.org/sqlite's parameters, after the file
// name).
const SQLiteDSN = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// OpenSQLite opens a migrated SQLite database in a file of tb's own
// (SQLitePath) with SQLiteDSN, closed when tb ends. The caller links the
// "sqlite" driver in (imports modernc.org/sqlite).
func OpenSQLite(tb testing.TB) *sql.DB {
	tb.Helper()
	return OpenSQLiteDSN(tb, SQLiteDSN)
}

// OpenSQLiteDSN is OpenSQLite with another DSN suffix.
func OpenSQLiteDSN(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", "file:"+SQLitePath(tb)+dsn)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16) // not database/sql's 2: no reopening under concurrency
	require.NoError(tb, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

// SQLiteHarness adapts store, a store on db (opened by OpenSQLite), to the
// conformance suite (storetest) and to the tests that reuse its harness.
func SQLiteHarness(db *sql.DB, store driver.Store[*sql.Tx]) storetest.Harness[*sql.Tx] {
	return storetest.Harness[*sql.Tx]{
		Store: store,
		Begin: func(t *testing.T) *sql.Tx {
			tx, err := db.Begin()
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		TryBegin: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Commit:   func(tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		Exec:     SQLExec,
		QueryInt: SQLQueryInt,
		// Writers queue on SQLite's one write lock through busy_timeout,
		// which is not a queue: under load (or -race) a writer can wait
		// longer than the timeout, and the application retries.
		Retryable: sqltx.SQLiteBusy,
		Rows: func(t *testing.T, name, key string) []string {
			rows, err := db.Query(`SELECT printf('%d %!.17g %d %s %s', shard, value, ts, typeof(value), paused_until)
				FROM txlimit WHERE name = ? AND key = ? ORDER BY shard`, name, key)
			require.NoError(t, err)
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				out = append(out, s)
			}
			require.NoError(t, rows.Err())
			return out
		},
		Conns: db.Stats().MaxOpenConnections - 1,
		// SQLite has one level: SERIALIZABLE (one writer at a time).
		BeginLevel: func(ctx context.Context, _ sql.IsolationLevel) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Levels:     []sql.IsolationLevel{sql.LevelSerializable},
		Database: func(t *testing.T) string {
			var seq int
			var name, file string
			require.NoError(t, db.QueryRow("PRAGMA database_list").Scan(&seq, &name, &file))
			return file
		},
	}
}

// PostgresLevels are the isolation levels of PostgreSQL, at which the
// concurrency topic runs.
var PostgresLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// HeadroomQuery is how many more connections the PostgreSQL server takes
// (Harness.Headroom): max_connections less those open, less the ones
// reserved for superusers.
const HeadroomQuery = `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
	- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`

// QueryString runs a query of one string on db.
func QueryString(t *testing.T, db *sql.DB, query string) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(query).Scan(&s))
	return s
}

// SQLExec and SQLQueryInt are Harness.Exec and Harness.QueryInt on
// database/sql.
func SQLExec(ctx context.Context, tx *sql.Tx, query string) error {
	_, err := tx.ExecContext(ctx, query)
	return err
}

func SQLQueryInt(ctx context.Context, tx *sql.Tx, query string) (n int64, err error) {
	err = tx.QueryRowContext(ctx, query).Scan(&n)
	return n, err
}
