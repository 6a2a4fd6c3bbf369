package txlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// sqlPostgresDrivers are the database/sql drivers pgsqlstore is tested
// with, each with the pgx exec modes (default_query_exec_mode) to run:
// pgx's own ("pgx", registered by the stdlib import above) always, and lib/pq
// ("postgres") when it is linked in, as internal/sqldrivers does (lib/pq is
// kept out of this module's go.mod so that a txlimit user's module graph
// stays small).
func sqlPostgresDrivers() []sqlDriver {
	out := []sqlDriver{
		{"pgx_cache_statement", "pgx", "cache_statement"},
		{"pgx_exec", "pgx", "exec"},
		{"pgx_simple_protocol", "pgx", "simple_protocol"},
	}
	if slices.Contains(sql.Drivers(), "postgres") {
		out = append(out, sqlDriver{"libpq", "postgres", ""}, sqlDriver{"libpq_binary_parameters", "postgres", ""})
	}
	return out
}

// sqlDriver is a database/sql driver and, for pgx's, its exec mode.
type sqlDriver struct{ label, name, mode string }

// params are the DSN parameters of d: pgx's exec mode, and lib/pq's
// binary_parameters=yes for the variant that sends each statement in one
// round trip.
func (d sqlDriver) params() map[string]string {
	p := map[string]string{"default_query_exec_mode": d.mode}
	if d.label == "libpq_binary_parameters" {
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

// openSQLPostgres opens a *sql.DB with driverName on schema (as the
// search_path), at most conns connections, closed when t ends.
func openSQLPostgres(t *testing.T, d sqlDriver, schema string, conns int) *sql.DB {
	params := d.params()
	params["search_path"] = schema
	db, err := sql.Open(d.name, withParams(t, testdb.URL(t), params))
	require.NoError(t, err)
	db.SetMaxOpenConns(conns)
	// Keep them all: database/sql keeps 2 idle connections by default and
	// closes the others as they are released, so the concurrency topics
	// would open a server process for almost every call.
	db.SetMaxIdleConns(conns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func pgsqlHarness(t *testing.T, db *sql.DB, conns int, opts ...pgsqlstore.Option) harness[*sql.Tx] {
	return harness[*sql.Tx]{
		store: pgsqlstore.New(db, opts...),
		begin: func(t *testing.T) *sql.Tx {
			tx, err := db.Begin()
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		commit:   func(tx *sql.Tx) error { return tx.Commit() },
		rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		rows: func(t *testing.T, name, key string) []string {
			rows, err := db.Query(
				`SELECT format('%s %s %s %s', ctid, shard, value, ts) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
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
		conns:       conns - 1,
		skipsLocked: true,
	}
}

// TestPostgresDatabaseSQL runs the suite on pgsqlstore with each
// database/sql driver (and pgx exec mode), then with
// pgsqlstore.SingleKeyStatements (Citus distributed by key) on each driver,
// in parallel like TestPostgres.
func TestPostgresDatabaseSQL(t *testing.T) {
	t.Parallel()
	var _ = stdlib.GetDefaultDriver() // registers "pgx"
	for _, d := range sqlPostgresDrivers() {
		t.Run(d.label, func(t *testing.T) {
			t.Parallel()
			runSuite(t, func(t *testing.T, conns int32) harness[*sql.Tx] {
				return pgsqlHarness(t, openSQLPostgres(t, d, testdb.Schema(t), int(conns)), int(conns))
			})
		})
	}
	for _, d := range sqlPostgresDrivers() {
		if d.label == "pgx_exec" || d.label == "libpq_binary_parameters" {
			continue // the option changes statements, not how a driver sends them
		}
		t.Run("single_key_statements/"+d.label, func(t *testing.T) {
			t.Parallel()
			runSuite(t, func(t *testing.T, conns int32) harness[*sql.Tx] {
				return pgsqlHarness(t, openSQLPostgres(t, d, testdb.Schema(t), int(conns)), int(conns), pgsqlstore.SingleKeyStatements())
			})
		})
	}
}

// TestDatabaseSQLThroughPgBouncer is TestLimitThroughPgBouncer for
// pgsqlstore: 16 clients against one limit through a real PgBouncer in
// transaction mode with two server connections, with pgx's driver in the
// exec modes that work there and with lib/pq (which runs each statement
// with parameters as an unnamed prepared statement, inside the
// transaction's server connection) when it is linked in. The sharded case
// runs the savepoints of the SKIP LOCKED fast path through the pooler.
func TestDatabaseSQLThroughPgBouncer(t *testing.T) {
	t.Parallel()
	testdb.NeedPgBouncer(t)
	dbName, direct := testdb.Database(t, "txlimit_pgbouncer")
	admin, err := pgxpool.New(context.Background(), direct)
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, migrations.Up(context.Background(), stdlib.OpenDBFromPool(admin), migrations.Postgres))
	bouncer := testdb.PgBouncer(t, dbName, "transaction", 2)

	const clients, calls, capacity = 16, 10, 100
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, d := range sqlPostgresDrivers() {
		if d.mode == "cache_statement" {
			continue // named prepared statements per server connection: 42P05 through the pooler
		}
		for _, c := range []struct {
			inTx   bool
			shards int
		}{{true, 1}, {false, 1}, {true, 4}} {
			inTx := c.inTx
			t.Run(fmt.Sprintf("%s/tx=%v/shards=%d", d.label, inTx, c.shards), func(t *testing.T) {
				db, err := sql.Open(d.name, withParams(t, bouncer, d.params()))
				require.NoError(t, err)
				defer db.Close()
				db.SetMaxOpenConns(clients)
				db.SetMaxIdleConns(clients)
				name := uniqueName(t, "pgbouncer")
				l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
					name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: c.shards},
				}, &txlimit.Options{Clock: func() time.Time { return frozen }})
				require.NoError(t, err)
				require.NoError(t, l.Ping(context.Background()))

				requireExactAdmission(t, l, name, clients, calls, capacity, func() (res txlimit.Result, err error) {
					if !inTx {
						return l.Limit(context.Background(), name, "k")
					}
					tx, err := db.BeginTx(context.Background(), nil)
					if err != nil {
						return res, err
					}
					defer func() { _ = tx.Rollback() }()
					if res, err = l.LimitTx(context.Background(), tx, name, "k"); err != nil {
						return res, err
					}
					return res, tx.Commit()
				})
			})
		}
	}
}
