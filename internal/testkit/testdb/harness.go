package testdb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/migrations"
)

// PgxHarness adapts store, a store on pool, to the conformance suite
// (storetest) and to the tests that reuse its harness.
func PgxHarness(pool *pgxpool.Pool, store driver.Store[pgx.Tx]) storetest.Harness[pgx.Tx] {
	return storetest.Harness[pgx.Tx]{
		Store: store,
		Begin: func(t *testing.T) pgx.Tx {
			tx, err := pool.Begin(context.Background())
			require.NoError(t, err)
			// A failed assertion must not leak the connection.
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx
		},
		Commit:   func(tx pgx.Tx) error { return tx.Commit(context.Background()) },
		Rollback: func(tx pgx.Tx) { _ = tx.Rollback(context.Background()) },
		Rows: func(t *testing.T, name, key string) []string {
			rows, err := pool.Query(context.Background(),
				`SELECT format('%s %s %s %s', ctid, shard, value, ts) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
				name, key)
			require.NoError(t, err)
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return out
		},
		Conns:       int(pool.Config().MaxConns) - 1,
		SkipsLocked: true,
	}
}

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
		Commit:   func(tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		Rows: func(t *testing.T, name, key string) []string {
			rows, err := db.Query(`SELECT printf('%d %!.17g %d %s', shard, value, ts, typeof(value))
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
	}
}
