package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

// The MySQL and MariaDB subjects: txlimit on mysqlstore, against the
// hand-written floor on the same server (BEGIN; SELECT … FOR UPDATE;
// UPDATE; COMMIT) and, in the business transaction, against that
// transaction with no limit at all.
const (
	mysqlFloorDDL    = "CREATE TABLE floor_table (k VARBINARY(600) PRIMARY KEY, value DOUBLE NOT NULL, ts DATETIME(6) NOT NULL)"
	mysqlFloorInsert = "INSERT IGNORE INTO floor_table (k, value, ts) VALUES (?, ?, ?)"
	mysqlFloorSelect = "SELECT value, ts FROM floor_table WHERE k = ? FOR UPDATE"
	mysqlFloorUpdate = "UPDATE floor_table SET value = ?, ts = ? WHERE k = ?"

	mysqlBusinessDDL = "CREATE TABLE bench_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(600) NOT NULL, " +
		"amount INT NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))"
	mysqlBusinessInsert = "INSERT INTO bench_orders (k, amount) VALUES (?, ?)"
)

// mysqlEnv is the bench's database on the MySQL or MariaDB server.
type mysqlEnv struct {
	db      *sql.DB
	version string
	name    string // the database the run created (and drops)
}

// mysqlScenarios are the scenarios measured on MySQL: distinct keys and
// one hot key, each alone and inside the business transaction.
func mysqlScenarios() []scenario {
	return []scenario{
		{name: "distinct", shards: 1}, {name: "hot", hot: true, shards: 1},
		{name: "business", shards: 1, work: orderWork}, {name: "business-hot", hot: true, shards: 1, work: orderWork},
	}
}

// mysqlImpls are the implementations measured on MySQL.
func mysqlImpls() []impl[*mysqlEnv] {
	return []impl[*mysqlEnv]{
		{name: implNone, runs: func(s scenario) bool { return s.business() && !s.hot }, unlimited: true,
			open: func(e *mysqlEnv) subject { return mysqlNone{e.db} }},
		{name: implFloor, runs: always, checks: bucketChecks,
			open: func(e *mysqlEnv) subject { return mysqlFloor{e.db} }},
		{name: implTxlimit, runs: always, checks: bucketChecks,
			open: func(e *mysqlEnv) subject {
				return sqlLimit{db: e.db, store: mysqlstore.New(e.db), businessSQL: mysqlBusinessInsert}
			}},
	}
}

// openMySQL creates a database of its own on the server of dsn with
// txlimit's migrations, the floor's table and the business table in it,
// and the settings mysqlstore needs on every connection (parseTime,
// interpolateParams; the floor and the business write run with them too).
// cleanup drops it.
func openMySQL(ctx context.Context, dsn string) (env *mysqlEnv, cleanup func(), err error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("parse -mysql: %w", err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, nil, err
	}
	defer admin.Close()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	env = &mysqlEnv{name: "txlimit_bench_" + hex.EncodeToString(b)}
	if err := admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&env.version); err != nil {
		return nil, nil, fmt.Errorf("connect to -mysql: %w", err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+env.name); err != nil {
		return nil, nil, fmt.Errorf("create database %s: %w", env.name, err)
	}
	cfg.DBName = env.name
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	env.db, err = sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() {
		_ = env.db.Close()
		// The run's context may be cancelled by now; the database goes anyway.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		root := cfg.Clone()
		root.DBName = ""
		db, err := sql.Open("mysql", root.FormatDSN())
		if err == nil {
			_, err = db.ExecContext(ctx, "DROP DATABASE "+env.name)
			_ = db.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "txlimit-bench: could not drop database %s: %v\n", env.name, err)
		}
	}
	env.db.SetMaxOpenConns(4)
	env.db.SetMaxIdleConns(4)
	if err := migrations.Up(ctx, env.db, migrations.MySQL); err != nil {
		cleanup()
		return nil, nil, err
	}
	for _, ddl := range []string{mysqlFloorDDL, mysqlBusinessDDL} {
		if _, err := env.db.ExecContext(ctx, ddl); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("create the floor's and the business tables: %w", err)
		}
	}
	if err := driver.OpsOf[*sql.Tx](mysqlstore.New(env.db)).Ping(ctx); err != nil {
		cleanup()
		return nil, nil, err
	}
	return env, cleanup, nil
}

func (b *bench) mysql(ctx context.Context, env *mysqlEnv) error {
	scenarios := mysqlScenarios()
	impls := selected(mysqlImpls(), b.cfg)
	subjects := openAll(impls, env)
	for _, clients := range b.cfg.MySQLClients {
		// Each client keeps a connection of its own, idle between its
		// calls: a new connection costs the server a thread.
		env.db.SetMaxOpenConns(clients)
		env.db.SetMaxIdleConns(clients)
		if err := b.measure(ctx, cellsOf("mysql", scenarios, impls, clients), subjects, nil); err != nil {
			return err
		}
	}
	clients := slices.Max(b.cfg.MySQLClients)
	env.db.SetMaxOpenConns(clients)
	env.db.SetMaxIdleConns(clients)
	return b.checkLimits("mysql", scenarios, clients, subjects)
}

// mysqlNone is the business transaction with no limit.
type mysqlNone struct{ db *sql.DB }

func (s mysqlNone) newClient(ctx context.Context, _ limitSpec, key string, w work) (client, error) {
	business, err := orderOnly(w)
	if err != nil {
		return nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return newSQLClient(conn, mysqlBusinessInsert, key, business, func(context.Context, *sql.Tx) (bool, error) { return true, nil }), nil
}

func (mysqlNone) value(context.Context, limitSpec, string) (float64, error) {
	return 0, fmt.Errorf("the business transaction alone has no limit to read")
}

// mysqlFloor is the hand-written floor on MySQL: SELECT … FOR UPDATE of a
// row that exists (created when the client opens, outside the timed
// transactions), the refill and decision in Go, UPDATE.
type mysqlFloor struct{ db *sql.DB }

func (s mysqlFloor) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	business, err := orderOnly(w)
	if err != nil {
		return nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	k := floorKey(spec, key)
	if _, err := conn.ExecContext(ctx, mysqlFloorInsert, k, spec.Capacity, spec.now().UTC()); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return newSQLClient(conn, mysqlBusinessInsert, key, business, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		var value float64
		var ts time.Time
		if err := tx.QueryRowContext(ctx, mysqlFloorSelect, k).Scan(&value, &ts); err != nil {
			return false, err
		}
		now := spec.now()
		left := spec.project(value, ts, now) - 1
		if left < 0 {
			return false, nil
		}
		_, err := tx.ExecContext(ctx, mysqlFloorUpdate, left, now.UTC(), k)
		return err == nil, err
	}), nil
}

func (s mysqlFloor) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	var value float64
	var ts time.Time
	if err := s.db.QueryRowContext(ctx, "SELECT value, ts FROM floor_table WHERE k = ?", floorKey(spec, key)).Scan(&value, &ts); err != nil {
		return 0, err
	}
	return spec.project(value, ts, spec.now()), nil
}
