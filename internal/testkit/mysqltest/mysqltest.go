// Package mysqltest holds what mysqlstore's tests share: the MySQL or
// MariaDB server to test against, a database of its own for each test, and
// the conformance suite's harness for mysqlstore.
//
// go-sql-driver/mysql, which these helpers and the tests run on, is a
// test-only requirement of the root module: mysqlstore itself imports no
// driver. It and its one dependency (filippo.io/edwards25519) are the price
// of `go test ./...` running the MariaDB suite; scripts/modgraph.sh counts
// them in a pgstore user's module graph.
//
// The server: TEST_MYSQL_DSN (a go-sql-driver/mysql DSN, e.g.
// root:@tcp(127.0.0.1:3306)/test), else MariaDB or MySQL on 127.0.0.1:3306
// as root with no password (scripts/mariadb.sh starts one). When none
// answers the tests skip, except under CI=true, where they fail. Each test
// creates a database of its own (txlimit_test_<random>) and drops it at the
// end, so tests and test binaries can run in parallel against one server.
// docs/mysql.md tells how to run them against MySQL 8 in Docker.
package mysqltest

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

// LocalDSN is the server the tests use when TEST_MYSQL_DSN is not set.
const LocalDSN = "root:@tcp(127.0.0.1:3306)/test"

var (
	findOnce sync.Once
	base     *mysql.Config
	findErr  error
	logOnce  sync.Once
)

// Config returns the server's DSN, parsed, skipping or failing tb when no
// server answers. Its DBName is the one the DSN names. The first test of a
// binary that finds the server logs which one it is (testdb.Marker).
func Config(tb testing.TB) *mysql.Config {
	tb.Helper()
	findOnce.Do(func() { base, findErr = find() })
	if findErr != nil {
		testdb.SkipOrFail(tb, fmt.Sprintf("SKIPPING MySQL tests: %v (set TEST_MYSQL_DSN or run scripts/mariadb.sh)", findErr))
	}
	logOnce.Do(func() {
		source := "TEST_MYSQL_DSN"
		if os.Getenv("TEST_MYSQL_DSN") == "" {
			source = "TEST_MYSQL_DSN is unset: the local server"
		}
		shown := base.Clone()
		if shown.Passwd != "" {
			shown.Passwd = "xxxxx"
		}
		tb.Logf("%s MySQL/MariaDB %s (%s)", testdb.Marker, shown.FormatDSN(), source)
	})
	return base.Clone()
}

func find() (*mysql.Config, error) {
	dsn := cmp.Or(os.Getenv("TEST_MYSQL_DSN"), LocalDSN)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", dsn, err)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("%s does not answer: %w", cfg.Addr, err)
	}
	return cfg, nil
}

// StoreConfig sets on cfg the DSN parameters mysqlstore needs (see its
// package documentation).
func StoreConfig(cfg *mysql.Config) *mysql.Config {
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	return cfg
}

// EmptyDatabase creates a database of its own for tb, dropped when tb
// ends, and returns a DSN config that names it, with the store's
// parameters.
func EmptyDatabase(tb testing.TB) *mysql.Config {
	tb.Helper()
	cfg := Config(tb)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "txlimit_test_" + hex.EncodeToString(b)
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			tb.Errorf("drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE " + name); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg = StoreConfig(cfg)
	cfg.DBName = name
	return cfg
}

// Open opens cfg with conns connections, kept idle between calls (not
// database/sql's default of 2: each new connection costs the server a
// thread), closed when tb ends.
func Open(tb testing.TB, cfg *mysql.Config, conns int) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Database creates a database of its own for tb with txlimit's migrations
// applied and returns it open with conns connections.
func Database(tb testing.TB, conns int) *sql.DB {
	tb.Helper()
	if name := os.Getenv(storetest.ChildDatabase); name != "" {
		// A process of the concurrency topic's own, on the database of
		// the test that started it.
		cfg := StoreConfig(Config(tb))
		cfg.DBName = name
		return Open(tb, cfg, conns)
	}
	db := Open(tb, EmptyDatabase(tb), conns)
	if err := migrations.Up(context.Background(), db, migrations.MySQL); err != nil {
		tb.Fatalf("migrations.Up: %v", err)
	}
	return db
}

// ServerName names the server the tests run against, such as
// "MariaDB_10.11" or "MySQL_8.4", for subtest names.
func ServerName(tb testing.TB) string {
	tb.Helper()
	db := Open(tb, Config(tb), 1)
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		tb.Fatal(err)
	}
	product := "MySQL"
	if strings.Contains(strings.ToLower(version), "mariadb") {
		product = "MariaDB"
	}
	if m := regexp.MustCompile(`^\d+\.\d+`).FindString(version); m != "" {
		return product + "_" + m
	}
	return product
}
