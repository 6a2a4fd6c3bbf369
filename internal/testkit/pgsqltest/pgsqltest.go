// Package pgsqltest holds pgsqlstore's tests that run with each
// database/sql PostgreSQL driver: pgx's stdlib driver in pgsqlstore's own
// tests, and lib/pq in internal/testkit/sqldrivers, a module of its own (lib/pq is
// kept out of the library's go.mod so that a txlimit user's module graph
// stays small). Each test takes the drivers to run with.
package pgsqltest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net/url"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// Driver is a database/sql driver and, for pgx's, its exec mode
// (default_query_exec_mode).
type Driver struct{ Label, Name, Mode string }

// Pgx is pgx's stdlib driver ("pgx", registered by this package's import
// of it) in the exec modes pgsqlstore is tested with.
var Pgx = []Driver{
	{"pgx_cache_statement", "pgx", "cache_statement"},
	{"pgx_exec", "pgx", "exec"},
	{"pgx_simple_protocol", "pgx", "simple_protocol"},
}

// LibPQ is lib/pq ("postgres", registered by the caller's import of
// github.com/lib/pq), as it is and with binary_parameters=yes, which sends
// each statement in one round trip.
var LibPQ = []Driver{
	{"libpq", "postgres", ""},
	{"libpq_binary_parameters", "postgres", ""},
}

// params are the DSN parameters of d: pgx's exec mode, and lib/pq's
// binary_parameters=yes for the variant that sends each statement in one
// round trip.
func (d Driver) params() map[string]string {
	p := map[string]string{"default_query_exec_mode": d.Mode}
	if d.Label == "libpq_binary_parameters" {
		p["binary_parameters"] = "yes"
	}
	return p
}

// withParams adds query parameters to a PostgreSQL URL: search_path and
// default_query_exec_mode, which pgx reads, and which lib/pq passes to the
// server (search_path) or is not given.
func withParams(t *testing.T, base string, params map[string]string) string {
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	for k, v := range params {
		if v != "" {
			q.Set(k, v)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Open opens a *sql.DB with d on schema (as the search_path), at most conns
// connections, closed when t ends.
func Open(t *testing.T, d Driver, schema string, conns int) *sql.DB {
	params := d.params()
	params["search_path"] = schema
	params["application_name"] = schema // as testdb.Pool's (testdb.KillQuery)
	db, err := sql.Open(d.Name, withParams(t, testdb.URL(t), params))
	require.NoError(t, err)
	db.SetMaxOpenConns(conns)
	// Keep them all: database/sql keeps 2 idle connections by default and
	// closes the others as they are released, so the concurrency topics
	// would open a server process for almost every call.
	db.SetMaxIdleConns(conns)
	// But not for long (testdb.IdleTime).
	db.SetConnMaxIdleTime(testdb.IdleTime)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Harness adapts pgsqlstore on db, opened by Open with conns connections,
// to the conformance suite.
func Harness(db *sql.DB, conns int, opts ...pgsqlstore.Option) storetest.Harness[*sql.Tx] {
	return storetest.Harness[*sql.Tx]{
		Store: pgsqlstore.New(db, opts...),
		Begin: func(t *testing.T) *sql.Tx {
			tx, err := db.Begin()
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		TryBegin: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Commit:   func(tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		Exec:     testdb.SQLExec,
		QueryInt: testdb.SQLQueryInt,
		Retryable: func(err error) bool {
			// A transaction whose connection was killed under it ends in
			// database/sql's errors as well as the driver's.
			return pgsqlstore.Retryable(err) || errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn)
		},
		Kill: func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, testdb.KillQuery)
			return err
		},
		Rows: func(t *testing.T, name, key string) []string {
			rows, err := db.Query(
				`SELECT format('%s %s %s %s %s', ctid, shard, value, ts, paused_until) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
				name, key)
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
		Conns:       conns - 1,
		SkipsLocked: true,
		BeginLevel: func(ctx context.Context, level sql.IsolationLevel) (*sql.Tx, error) {
			return db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		},
		Levels: testdb.PostgresLevels,
		Headroom: func(ctx context.Context) (n int64, err error) {
			err = db.QueryRowContext(ctx, testdb.HeadroomQuery).Scan(&n)
			return n, err
		},
		Database: func(t *testing.T) string { return testdb.QueryString(t, db, "SELECT current_schema()") },
	}
}

// Suite runs the conformance suite on pgsqlstore with each of drivers, then
// with pgsqlstore.SingleKeyStatements (Citus distributed by key) on each
// driver, every one a parallel subtest named after its driver.
func Suite(t *testing.T, drivers []Driver) {
	for _, d := range drivers {
		t.Run(d.Label, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[*sql.Tx] {
				return Harness(Open(t, d, testdb.Schema(t), int(conns)), int(conns))
			})
		})
	}
	for _, d := range drivers {
		if d.Label == "pgx_exec" || d.Label == "libpq_binary_parameters" {
			continue // the option changes statements, not how a driver sends them
		}
		t.Run("single_key_statements/"+d.Label, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[*sql.Tx] {
				return Harness(Open(t, d, testdb.Schema(t), int(conns)), int(conns), pgsqlstore.SingleKeyStatements())
			})
		})
	}
}
