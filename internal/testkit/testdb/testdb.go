// Package testdb finds a PostgreSQL server for txlimit's tests and gives each
// test binary a schema of its own on it. It also opens SQLite files for
// tests, adapts sqlitestore to the conformance suite (SQLiteHarness; pgxtest
// adapts pgstore), and is the TestMain of the packages whose tests wait on
// PostgreSQL (Main).
//
// The server is, in order: TEST_DATABASE_URL; a local server on
// 127.0.0.1:5432 (database test, user postgres, trust auth, as DEVELOPERS.md
// sets up); a throwaway container, only when a Docker engine answers. The
// container is started by the program in internal/testkit/pgcontainer, a module of
// its own so that testcontainers-go and its Docker client stay out of the
// library's go.mod: testdb runs it with `go run`, reads the server's URL from
// its first line of output, and the program removes the container when the
// test binary exits (its stdin closes).
//
// When no server is reachable the tests skip, saying why and how to provide
// one, except under CI=true, where a missing PostgreSQL fails the run. The
// first test of a binary that finds the server logs which one it is and
// where it came from (a line that begins with Marker), for
// internal/testkit/testsummary to list.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/migrations"
)

// LocalURL is the server tried when TEST_DATABASE_URL is unset.
const LocalURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	findOnce  sync.Once
	baseURL   string
	urlSource string // where baseURL came from
	findErr   error
	logOnce   sync.Once
)

// URL returns the connection string of the test server, skipping or failing
// tb when there is none.
func URL(tb testing.TB) string {
	tb.Helper()
	findOnce.Do(func() {
		baseURL, urlSource, findErr = finder{
			getenv:    os.Getenv,
			ping:      ping,
			docker:    func() error { return dockerEngine(os.Getenv) },
			container: startContainer,
		}.find()
	})
	if findErr != nil {
		missing(tb, findErr, os.Getenv("CI") == "true")
	}
	logOnce.Do(func() { tb.Logf("%s PostgreSQL %s (%s)", Marker, redacted(baseURL), urlSource) })
	return baseURL
}

// redacted is u with its password, if any, as "xxxxx".
func redacted(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return "(a URL that does not parse)"
}

// missing fails tb under CI and skips it otherwise, saying how to provide
// a server.
func missing(tb testing.TB, err error, ci bool) {
	tb.Helper()
	if ci {
		tb.Fatalf("PostgreSQL is required under CI=true: %v", err)
		return
	}
	tb.Skipf("SKIPPING PostgreSQL tests: %v (set TEST_DATABASE_URL, run scripts/postgres.sh, or start Docker)", err)
}

// finder holds the steps of the search, replaced by fakes in tests.
type finder struct {
	getenv    func(string) string
	ping      func(url string) error
	docker    func() error // nil when a Docker engine answers
	container func() (url string, err error)
}

// find returns the server's URL and where it came from.
func (f finder) find() (u, source string, err error) {
	if u = f.getenv("TEST_DATABASE_URL"); u != "" {
		if err := f.ping(u); err != nil {
			return "", "", fmt.Errorf("TEST_DATABASE_URL is set but unreachable: %w", err)
		}
		return u, "TEST_DATABASE_URL", nil
	}
	localErr := f.ping(LocalURL)
	if localErr == nil {
		return LocalURL, "TEST_DATABASE_URL is unset: the local server", nil
	}
	if err := f.docker(); err != nil {
		return "", "", fmt.Errorf("no server at %s (%v) and no Docker engine for a container (%v)", LocalURL, localErr, err)
	}
	u, err = f.container()
	if err != nil {
		return "", "", fmt.Errorf("no server at %s (%v) and no container: %w", LocalURL, localErr, err)
	}
	if err := f.ping(u); err != nil {
		return "", "", fmt.Errorf("the container's server at %s is unreachable: %w", u, err)
	}
	return u, "TEST_DATABASE_URL is unset and no local server answers: a Docker container", nil
}

func ping(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// Schema creates a new schema with txlimit's migrations applied, dropped when
// tb ends, and returns its name.
//
// The tables are made by the migrations' Up statements run as one
// simple-protocol query (one round trip, one transaction) on a connection of
// a small pool kept for the test binary, not by goose: goose opens its own
// connections, creates its version and lock tables, and takes and releases
// its lock row, a dozen round trips and DDL of its own per schema, which the
// root package's ~120 schemas per run paid in full (about a fifth of its
// time). The schema has no goose version table. TestSchemaMatchesGoose holds
// the result to what goose makes; a migration using a goose annotation other
// than Up and Down is run through goose instead.
func Schema(tb testing.TB) string {
	tb.Helper()
	if schema := os.Getenv(storetest.ChildDatabase); schema != "" {
		return schema // a process of the concurrency topic's own
	}
	schema := EmptySchema(tb)
	ctx := context.Background()
	ddl, err := upSQL()
	if err != nil {
		tb.Fatalf("migrations: %v", err)
	}
	if ddl == "" {
		migrateWithGoose(tb, schema)
		return schema
	}
	if _, err := admin(tb).Exec(ctx, "SET search_path TO "+schema+"; "+ddl); err != nil {
		tb.Fatalf("migrations: %v", err)
	}
	return schema
}

// migrateWithGoose runs migrations.Up on schema.
func migrateWithGoose(tb testing.TB, schema string) {
	tb.Helper()
	// A pool of its own, closed as soon as the schema is migrated: a pool
	// left open until tb ends would hold its idle connections, two per
	// schema, beside the test's own pools. (goose needs two: its table
	// lock is renewed on one while the migrations run on the other.)
	pool := newPool(tb, schema, pgx.QueryExecModeCacheStatement, 2)
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(context.Background(), db, migrations.Postgres); err != nil {
		tb.Fatalf("migrations: %v", err)
	}
}

var (
	upOnce sync.Once
	upText string
	upErr  error
)

// upSQL returns the Up statements of every PostgreSQL migration, in order,
// as one text, or "" when a file uses a goose annotation other than Up and
// Down (StatementBegin, NO TRANSACTION, envsub): those are for goose.
func upSQL() (string, error) {
	upOnce.Do(func() { upText, upErr = readUpSQL(migrations.Postgres) })
	return upText, upErr
}

func readUpSQL(dialect migrations.Dialect) (string, error) {
	fsys, err := migrations.FS(dialect)
	if err != nil {
		return "", err
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return "", err
	}
	sort.Strings(names) // goose's order: the zero-padded version numbers
	var b strings.Builder
	for _, name := range names {
		text, err := fs.ReadFile(fsys, name)
		if err != nil {
			return "", err
		}
		up := false
		for _, line := range strings.SplitAfter(string(text), "\n") {
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "-- +goose"); ok {
				switch strings.TrimSpace(a) {
				case "Up":
					up = true
				case "Down":
					up = false
				default:
					return "", nil
				}
				continue
			}
			if up {
				b.WriteString(line)
			}
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

var (
	adminOnce sync.Once
	adminPool *pgxpool.Pool
	adminErr  error
)

// admin returns a pool of at most 3 connections for creating and dropping
// schemas, kept open for the life of the test binary: a connection of its
// own per schema would cost a server process's start each time.
func admin(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := URL(tb)
	adminOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			adminErr = err
			return
		}
		cfg.MaxConns = 3
		cfg.MaxConnIdleTime = 5 * time.Second
		cfg.HealthCheckPeriod = 5 * time.Second
		adminPool, adminErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if adminErr != nil {
		tb.Fatalf("admin pool: %v", adminErr)
	}
	return adminPool
}

// EmptySchema creates a new schema without txlimit's table, dropped when tb
// ends, and returns its name.
func EmptySchema(tb testing.TB) string {
	tb.Helper()
	pool := admin(tb)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_test_" + hex.EncodeToString(b)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	return schema
}

// Pool opens a pool on schema (as the search_path) with the given exec mode
// and at most maxConns connections, closed when tb ends.
func Pool(tb testing.TB, schema string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	pool := newPool(tb, schema, mode, maxConns)
	tb.Cleanup(pool.Close)
	return pool
}

// PoolParams is Pool with more server settings on every connection (for
// example default_transaction_isolation, lock_timeout, application_name).
func PoolParams(tb testing.TB, schema string, mode pgx.QueryExecMode, maxConns int32, params map[string]string) *pgxpool.Pool {
	tb.Helper()
	pool := newPool(tb, schema, mode, maxConns, params)
	tb.Cleanup(pool.Close)
	return pool
}

func newPool(tb testing.TB, schema string, mode pgx.QueryExecMode, maxConns int32, params ...map[string]string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("parse url: %v", err)
	}
	// The schema's name, unless params say otherwise: a test tells its
	// connections in pg_stat_activity by it (KillQuery).
	cfg.ConnConfig.RuntimeParams["application_name"] = schema
	for _, ps := range params {
		for k, v := range ps {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = IdleTime, IdleTime/2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pool: %v", err)
	}
	return pool
}

// IdleTime is how long the tests' pools keep a connection no test uses:
// long enough for a test to reuse its connections from call to call, short
// enough that the pools of tests waiting for their turn to open many
// connections at once (the conformance suite's concurrency topic, 65) give
// theirs back to the server meanwhile.
const IdleTime = 3 * time.Second

// ExecModes are the pgx query exec modes the stores must work in. Simple
// protocol and exec mode are what PgBouncer in transaction mode needs.
var ExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}
