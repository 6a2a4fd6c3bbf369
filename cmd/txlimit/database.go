package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// row is one row of the table txlimit: its name and key, and the shard's
// state as the library reads it.
type row struct {
	Name string
	Key  string
	driver.Row
}

// database is an open database of either dialect. Its Limiter operations go
// through the public API (txlimit.New on store); listing keys and reading a
// key's rows shard by shard have no public API, so rows reads the table
// with a plain SELECT.
type database[TTx any] struct {
	dialect migrations.Dialect
	sqlDB   *sql.DB // for the migrations
	store   driver.Store[TTx]
	// snapshot runs fn in a read-only transaction whose statements all see
	// one snapshot of the database.
	snapshot func(ctx context.Context, fn func(TTx) error) error
	// write runs fn in a transaction that may write.
	write func(ctx context.Context, fn func(TTx) error) error
	// rows returns the rows of name (every name when ""), of key when
	// key is not nil, ordered by name, key and shard.
	rows func(ctx context.Context, tx TTx, name string, key *string) ([]row, error)
	// now reads the clock the store decides with.
	now   func(ctx context.Context, tx TTx) (time.Time, error)
	close func()
}

func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// rowsWhere returns the WHERE clause of database.rows with placeholders
// made by ph (1-based), and its arguments.
func rowsWhere(name string, key *string, ph func(int) string) (string, []any) {
	var conds []string
	var args []any
	if name != "" {
		args = append(args, name)
		conds = append(conds, "name = "+ph(len(args)))
	}
	if key != nil {
		args = append(args, *key)
		conds = append(conds, "key = "+ph(len(args)))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// selectRows reads every column the library's state has: prev is the
// previous window's count of a sliding window (0 for the other kinds).
const selectRows = "SELECT name, key, shard, value, prev, ts FROM txlimit"

func openPostgres(ctx context.Context, dsn string) (*database[pgx.Tx], error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usageError{fmt.Errorf("-dsn: %v", err)}
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	return &database[pgx.Tx]{
		dialect: migrations.Postgres,
		sqlDB:   sqlDB,
		store:   pgstore.New(pool),
		snapshot: func(ctx context.Context, fn func(pgx.Tx) error) error {
			return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
		},
		write: func(ctx context.Context, fn func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, pool, fn)
		},
		rows: func(ctx context.Context, tx pgx.Tx, name string, key *string) ([]row, error) {
			where, args := rowsWhere(name, key, func(i int) string { return fmt.Sprintf("$%d", i) })
			rs, err := tx.Query(ctx, selectRows+where+" ORDER BY name, key, shard", args...)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
				var x row
				err := r.Scan(&x.Name, &x.Key, &x.Shard, &x.Value, &x.Prev, &x.TS)
				return x, err
			})
		},
		now: func(ctx context.Context, tx pgx.Tx) (t time.Time, err error) {
			// pgstore decides with clock_timestamp().
			err = tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
			return t, err
		},
		close: func() { _ = sqlDB.Close(); pool.Close() },
	}, nil
}

// openSQLite opens dsn, a file: URI used as given or a path. A path must
// exist unless create: a mistyped path would otherwise become a new, empty
// database.
func openSQLite(dsn string, create bool) (*database[*sql.Tx], error) {
	if !strings.HasPrefix(dsn, "file:") {
		if _, err := os.Stat(dsn); err != nil && !create {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no SQLite database at %s (txlimit migrate up creates one; PostgreSQL DSNs begin with postgres://)", dsn)
			}
			return nil, err
		}
		// Wait for the application's writers rather than fail at once, and
		// take the write lock at BEGIN in a transaction that will write.
		dsn = "file:" + dsn + "?_pragma=busy_timeout(5000)&_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, usageError{fmt.Errorf("-dsn: %v", err)}
	}
	inTx := func(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return &database[*sql.Tx]{
		dialect: migrations.SQLite,
		sqlDB:   db,
		store:   sqlitestore.New(db),
		snapshot: func(ctx context.Context, fn func(*sql.Tx) error) error {
			// A read transaction sees one snapshot from its first read on.
			return inTx(ctx, &sql.TxOptions{ReadOnly: true}, fn)
		},
		write: func(ctx context.Context, fn func(*sql.Tx) error) error {
			return inTx(ctx, nil, fn)
		},
		rows: func(ctx context.Context, tx *sql.Tx, name string, key *string) ([]row, error) {
			where, args := rowsWhere(name, key, func(int) string { return "?" })
			rs, err := tx.QueryContext(ctx, selectRows+where+" ORDER BY name, key, shard", args...)
			if err != nil {
				return nil, err
			}
			defer rs.Close()
			var out []row
			for rs.Next() {
				var x row
				var ts int64 // microseconds since the epoch
				if err := rs.Scan(&x.Name, &x.Key, &x.Shard, &x.Value, &x.Prev, &ts); err != nil {
					return nil, err
				}
				x.TS = time.UnixMicro(ts).UTC()
				out = append(out, x)
			}
			return out, rs.Err()
		},
		now: func(context.Context, *sql.Tx) (time.Time, error) {
			// sqlitestore decides with the process's clock, at microseconds.
			return time.UnixMicro(time.Now().UnixMicro()).UTC(), nil
		},
		close: func() { _ = db.Close() },
	}, nil
}
