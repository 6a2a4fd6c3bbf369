// Package testdb finds a PostgreSQL server for txlimit's tests and gives each
// test binary a schema of its own on it.
//
// The server is, in order: TEST_DATABASE_URL; a local server on
// 127.0.0.1:5432 (database test, user postgres, trust auth, as DEVELOPERS.md
// sets up); a throwaway container through testcontainers-go when a Docker
// engine answers. When none is reachable the tests skip, loudly, except
// under CI=true, where a missing PostgreSQL fails the run.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/txlimit/txlimit/migrations"
)

// LocalURL is the server tried when TEST_DATABASE_URL is unset.
const LocalURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	findOnce sync.Once
	baseURL  string
	findErr  error
)

// URL returns the connection string of the test server, skipping or failing
// tb when there is none.
func URL(tb testing.TB) string {
	tb.Helper()
	findOnce.Do(func() { baseURL, findErr = find() })
	if findErr != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("PostgreSQL is required under CI=true: %v", findErr)
		}
		tb.Skipf("SKIPPING PostgreSQL tests: %v (set TEST_DATABASE_URL, start a local server, or start Docker)", findErr)
	}
	return baseURL
}

func find() (string, error) {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		if err := ping(u); err != nil {
			return "", fmt.Errorf("TEST_DATABASE_URL is set but unreachable: %w", err)
		}
		return u, nil
	}
	localErr := ping(LocalURL)
	if localErr == nil {
		return LocalURL, nil
	}
	u, err := container()
	if err != nil {
		return "", fmt.Errorf("no server at %s (%v) and no container (%v)", LocalURL, localErr, err)
	}
	return u, nil
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

// container starts PostgreSQL with testcontainers-go. testcontainers' reaper
// removes it when the test process ends.
func container() (url string, err error) {
	defer func() {
		if r := recover(); r != nil { // testcontainers panics on some Docker setups
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return "", err
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return "", err
	}
	c, err := testcontainers.Run(ctx, "postgres:16-alpine",
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_DB": "test"}),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
	)
	if err != nil {
		return "", err
	}
	hostPort, err := c.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		return "", err
	}
	return "postgres://postgres@" + hostPort + "/test?sslmode=disable", nil
}

// Schema creates a new schema with txlimit's migrations applied, dropped when
// tb ends, and returns its name.
func Schema(tb testing.TB) string {
	tb.Helper()
	url := URL(tb)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_test_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
	})
	pool := Pool(tb, schema, pgx.QueryExecModeCacheStatement, 2)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		tb.Fatalf("migrations: %v", err)
	}
	return schema
}

// Pool opens a pool on schema (as the search_path) with the given exec mode
// and at most maxConns connections, closed when tb ends.
func Pool(tb testing.TB, schema string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("parse url: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// ExecModes are the pgx query exec modes the stores must work in. Simple
// protocol and exec mode are what PgBouncer in transaction mode needs.
var ExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}
