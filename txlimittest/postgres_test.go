package txlimittest_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/txlimittest"
)

// serverPool opens a pool of at most maxConns connections on the test
// server, as an application's tests would on theirs, closed when t ends.
func serverPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestPostgresSchema(t *testing.T) {
	ctx := context.Background()
	// One connection: the migrations, which need two, run on a pool of
	// their own.
	pool := serverPool(t, 1)
	var outer string
	if err := pool.QueryRow(ctx, "SHOW search_path").Scan(&outer); err != nil {
		t.Fatal(err)
	}
	var schema string
	t.Run("use", func(t *testing.T) {
		p := txlimittest.PostgresSchema(t, pool)
		var path string
		if err := p.QueryRow(ctx, "SELECT current_schema(), current_setting('search_path')").Scan(&schema, &path); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(schema, "txlimittest_") || path != schema+", "+outer {
			t.Fatalf("current_schema() = %q, search_path %q; want txlimittest_…, then %q", schema, path, outer)
		}
		for _, table := range []string{"txlimit", "txlimit_goose_version"} {
			var found bool
			if err := p.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", schema+"."+table).Scan(&found); err != nil || !found {
				t.Errorf("table %s.%s: found %v, %v", schema, table, found, err)
			}
		}
		// A second schema is another test's: their limits share no row.
		clock := txlimittest.NewClock(t0)
		opts := &txlimit.Options{Clock: clock.Now}
		l1, _ := txlimittest.Postgres(t, pool, perMinute, opts)
		l2, _ := txlimittest.Postgres(t, pool, perMinute, opts)
		txlimittest.RequireAdmitted(t, l1, "send", "alice", txlimit.Count(3))
		txlimittest.RequireRemaining(t, l1, "send", "alice", 0)
		txlimittest.RequireRemaining(t, l2, "send", "alice", 3)
		if err := l1.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	})
	if schema == "" {
		t.Fatal("no schema")
	}
	if schemaExists(t, pool, schema) {
		t.Errorf("schema %s is still there after the test", schema)
	}
}

func TestPostgres(t *testing.T) {
	ctx := context.Background()
	clock := txlimittest.NewClock(t0)
	l, p := txlimittest.Postgres(t, serverPool(t, 4), perMinute, &txlimit.Options{Clock: clock.Now})
	beginPgx := func() (pgx.Tx, error) { return p.Begin(ctx) }

	// The Clock replaces PostgreSQL's clock_timestamp() in the SQL.
	for range 3 {
		txlimittest.RequireAdmitted(t, l, "send", "alice")
	}
	res := txlimittest.RequireDenied(t, l, "send", "alice", 20*time.Second)
	if !res.At.Equal(t0) {
		t.Errorf("At = %v, want the clock's %v", res.At, t0)
	}
	clock.Advance(5 * time.Second)
	txlimittest.RequireRemaining(t, l, "send", "alice", 0.25)
	txlimittest.RequireDenied(t, l, "send", "alice", 15*time.Second)

	mustPass(t, func(tb testing.TB) {
		tx, err := p.Begin(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		defer tx.Rollback(ctx)
		txlimittest.RequireAdmittedTx(tb, l, tx, "send", "bob", txlimit.Count(2))
		txlimittest.RequireRemainingTx(tb, l, tx, "send", "bob", 1)
		txlimittest.RequireDeniedTx(tb, l, tx, "send", "bob", 20*time.Second, txlimit.Count(2))
		txlimittest.RequireRemaining(tb, l, "send", "bob", 3) // a read does not wait for tx's lock

		txlimittest.RequireRollbackRestores(tb, l, beginPgx, "send", "carol", func(tx pgx.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "carol")
		})
	})
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, beginPgx, "send", "carol", func(tx pgx.Tx) {})
	}, `RequireRollbackRestores("send", "carol")`, "fn changed nothing")
	mustFail(t, func(tb testing.TB) {
		txlimittest.RequireRollbackRestores(tb, l, beginPgx, "send", "carol", func(tx pgx.Tx) {
			txlimittest.RequireAdmittedTx(tb, l, tx, "send", "carol")
			_, _ = tx.Exec(ctx, "SELECT 1/0") // the code under test fails: the transaction is aborted
		})
	}, "CheckTx in the transaction", "25P02")
	mustFail(t, func(tb testing.TB) {
		tx, err := p.Begin(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		defer tx.Rollback(ctx)
		txlimittest.RequireDeniedTx(tb, l, tx, "send", "dave", txlimittest.AnyRetryAfter)
	}, `LimitTx("send", "dave")`, "want denied, got admitted (Remaining 2)")

	// Prune, at the limiter's clock: only alice's row was ever committed,
	// and it is full again a minute later.
	if r := txlimittest.Prune(t, l, nil); r.Deleted != 0 || r.Keys != 1 || !r.Complete {
		t.Errorf("Prune = %+v, want alice's row examined, not deleted", r)
	}
	clock.Advance(time.Minute)
	if r := txlimittest.Prune(t, l, nil); r.Deleted != 1 || r.Keys != 1 || !r.Complete {
		t.Errorf("Prune a minute later = %+v, want alice's row deleted", r)
	}
}

func TestPostgresDatabaseSQL(t *testing.T) {
	ctx := context.Background()
	clock := txlimittest.NewClock(t0)
	db := stdlib.OpenDBFromPool(txlimittest.PostgresSchema(t, serverPool(t, 4)))
	t.Cleanup(func() { _ = db.Close() })
	l, err := txlimit.New(pgsqlstore.New(db), perMinute, &txlimit.Options{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	txlimittest.RequireAdmitted(t, l, "send", "alice", txlimit.Count(3))
	txlimittest.RequireDenied(t, l, "send", "alice", 20*time.Second)
	txlimittest.RequireRollbackRestores(t, l, db.Begin, "send", "bob", func(tx *sql.Tx) {
		txlimittest.RequireAdmittedTx(t, l, tx, "send", "bob")
	})
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
