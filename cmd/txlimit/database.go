package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
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

// database is an open database of any dialect. Its Limiter operations go
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
	// key is not nil, ordered by name, key and shard; locked until tx ends
	// when lock is set (SQLite's write transaction holds the database).
	rows func(ctx context.Context, tx TTx, name string, key *string, lock bool) ([]row, error)
	// now reads the clock the store decides with.
	now   func(ctx context.Context, tx TTx) (time.Time, error)
	close func()
	// opened says which store the DSN selected and where it is, for the
	// operator (on stderr): "pgstore: PostgreSQL at db:5432, database app".
	opened string
}

// The stores a DSN selects, by its form.
const (
	postgresStore = "pgstore"
	mysqlStore    = "mysqlstore"
	sqliteStore   = "sqlitestore"
)

// storeOf returns the store dsn selects: a postgres:// or postgresql:// URL
// is PostgreSQL's; a mysql:// URL, or a go-sql-driver/mysql DSN (a network
// and address in parentheses before the database: user:pass@tcp(host:3306)/db,
// user@unix(/run/mysqld/mysqld.sock)/db), MySQL's or MariaDB's; anything else
// is a SQLite file path or file: URI.
func storeOf(dsn string) string {
	switch {
	case strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://"):
		return postgresStore
	case strings.HasPrefix(dsn, "mysql://"):
		return mysqlStore
	}
	for _, network := range []string{"tcp(", "tcp4(", "tcp6(", "unix("} {
		if strings.HasPrefix(dsn, network) || strings.Contains(dsn, "@"+network) {
			return mysqlStore
		}
	}
	return sqliteStore
}

// rowsWhere returns the WHERE clause of database.rows with placeholders
// made by ph (1-based), and its arguments, key quoted by quoteKey (MySQL
// reserves the word). arg converts an argument: MySQL's name and key are
// VARBINARY, compared as bytes.
func rowsWhere(name string, key *string, ph func(int) string, keyColumn string, arg func(string) any) (string, []any) {
	var conds []string
	var args []any
	if name != "" {
		args = append(args, arg(name))
		conds = append(conds, "name = "+ph(len(args)))
	}
	if key != nil {
		args = append(args, arg(*key))
		conds = append(conds, keyColumn+" = "+ph(len(args)))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// selectRows reads every column the library's state has: prev is the
// previous window's count of a sliding window (0 for the other kinds),
// paused_until the key's pause (NULL for none). keyColumn is key, quoted
// where the dialect reserves the word.
func selectRows(keyColumn string) string {
	return "SELECT name, " + keyColumn + ", shard, value, prev, ts, paused_until FROM txlimit"
}

func asString(s string) any { return s }

// forUpdate is the clause that locks the rows a SELECT reads, when lock.
func forUpdate(lock bool) string {
	if lock {
		return " FOR UPDATE"
	}
	return ""
}

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
		return nil, fmt.Errorf("connect to PostgreSQL (the -dsn selected pgstore): %w", err)
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
		rows: func(ctx context.Context, tx pgx.Tx, name string, key *string, lock bool) ([]row, error) {
			where, args := rowsWhere(name, key, func(i int) string { return fmt.Sprintf("$%d", i) }, "key", asString)
			rs, err := tx.Query(ctx, selectRows("key")+where+" ORDER BY name, key, shard"+forUpdate(lock), args...)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
				var x row
				var paused *time.Time
				err := r.Scan(&x.Name, &x.Key, &x.Shard, &x.Value, &x.Prev, &x.TS, &paused)
				if paused != nil {
					x.Paused = *paused
				}
				return x, err
			})
		},
		now: func(ctx context.Context, tx pgx.Tx) (t time.Time, err error) {
			// pgstore decides with clock_timestamp().
			err = tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
			return t, err
		},
		close:  func() { _ = sqlDB.Close(); pool.Close() },
		opened: fmt.Sprintf("%s: PostgreSQL at %s, database %s", postgresStore, net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port)), cfg.ConnConfig.Database),
	}, nil
}

// openSQLite opens dsn, a file: URI used as given or a path. A path must
// exist unless create: a mistyped path would otherwise become a new, empty
// database.
func openSQLite(dsn string, create bool) (*database[*sql.Tx], error) {
	if !strings.HasPrefix(dsn, "file:") {
		if _, err := os.Stat(dsn); err != nil && !create {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no SQLite database at %s (-dsn %q is read as a SQLite file path; txlimit migrate up creates one; "+
					"a PostgreSQL DSN begins with postgres://, a MySQL or MariaDB one is user:password@tcp(host:3306)/db or mysql://user:password@host:3306/db)", dsn, dsn)
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
	inTx := inSQLTx(db)
	file := strings.TrimPrefix(dsn, "file:")
	file, _, _ = strings.Cut(file, "?")
	return &database[*sql.Tx]{
		dialect: migrations.SQLite,
		sqlDB:   db,
		store:   sqlitestore.New(db),
		snapshot: func(ctx context.Context, fn func(*sql.Tx) error) error {
			// A read transaction sees one snapshot from its first read on.
			return inTx(ctx, &sql.TxOptions{ReadOnly: true}, fn)
		},
		write: func(ctx context.Context, fn func(*sql.Tx) error) error {
			// busy_timeout waits for the application's writers, but SQLite's
			// busy handler is not fair: a steady stream of them can keep the
			// write lock from this transaction past it. A failed transaction
			// rolled back whole, so an operator's command runs it again until
			// its -timeout rather than fail.
			for {
				err := inTx(ctx, nil, fn)
				if err == nil || !sqltx.SQLiteBusy(err) {
					return err
				}
				select {
				case <-ctx.Done():
					return err
				case <-time.After(10 * time.Millisecond):
				}
			}
		},
		rows: func(ctx context.Context, tx *sql.Tx, name string, key *string, _ bool) ([]row, error) {
			where, args := rowsWhere(name, key, func(int) string { return "?" }, "key", asString)
			rs, err := tx.QueryContext(ctx, selectRows("key")+where+" ORDER BY name, key, shard", args...)
			if err != nil {
				return nil, err
			}
			defer rs.Close()
			var out []row
			for rs.Next() {
				var x row
				var ts int64 // microseconds since the epoch, as paused_until
				var paused sql.NullInt64
				if err := rs.Scan(&x.Name, &x.Key, &x.Shard, &x.Value, &x.Prev, &ts, &paused); err != nil {
					return nil, err
				}
				x.TS = time.UnixMicro(ts).UTC()
				if paused.Valid {
					x.Paused = time.UnixMicro(paused.Int64).UTC()
				}
				out = append(out, x)
			}
			return out, rs.Err()
		},
		now: func(context.Context, *sql.Tx) (time.Time, error) {
			// sqlitestore decides with the process's clock, at microseconds.
			return time.UnixMicro(time.Now().UnixMicro()).UTC(), nil
		},
		close:  func() { _ = db.Close() },
		opened: fmt.Sprintf("%s: SQLite file %s", sqliteStore, file),
	}, nil
}

// inSQLTx returns a function that runs fn in a transaction of db, with
// opts, committed when fn returns nil and rolled back otherwise.
func inSQLTx(db *sql.DB) func(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	return func(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
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
}

// mysqlConfig parses dsn, a go-sql-driver/mysql DSN or a mysql:// URL
// (mysql://user:password@host:3306/db?param=value, the port 3306 when
// left out), and sets the parameters mysqlstore needs: parseTime and
// interpolateParams (see its package documentation; the other settings it
// checks, loc and clientFoundRows, are the DSN's to get right, and its
// errors name them).
func mysqlConfig(dsn string) (*mysql.Config, error) {
	if strings.HasPrefix(dsn, "mysql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, err
		}
		c := mysql.NewConfig()
		c.User = u.User.Username()
		c.Passwd, _ = u.User.Password()
		c.Net, c.Addr = "tcp", u.Host
		if u.Port() == "" {
			c.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		c.DBName = strings.TrimPrefix(u.Path, "/")
		dsn = c.FormatDSN()
		if u.RawQuery != "" {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + u.RawQuery
		}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	return cfg, nil
}

func openMySQL(ctx context.Context, dsn string) (*database[*sql.Tx], error) {
	cfg, err := mysqlConfig(dsn)
	if err != nil {
		return nil, usageError{fmt.Errorf("-dsn, read as a MySQL or MariaDB DSN: %v", err)}
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, usageError{fmt.Errorf("-dsn, read as a MySQL or MariaDB DSN: %v", err)}
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to MySQL or MariaDB (the -dsn selected mysqlstore): %w", err)
	}
	inTx := inSQLTx(db)
	bytes := func(s string) any { return []byte(s) }
	return &database[*sql.Tx]{
		dialect: migrations.MySQL,
		sqlDB:   db,
		store:   mysqlstore.New(db),
		snapshot: func(ctx context.Context, fn func(*sql.Tx) error) error {
			// InnoDB's consistent read under REPEATABLE READ: one snapshot
			// from the first read on.
			return inTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, fn)
		},
		write: func(ctx context.Context, fn func(*sql.Tx) error) error {
			return inTx(ctx, nil, fn)
		},
		rows: func(ctx context.Context, tx *sql.Tx, name string, key *string, lock bool) ([]row, error) {
			where, args := rowsWhere(name, key, func(int) string { return "?" }, "`key`", bytes)
			rs, err := tx.QueryContext(ctx, selectRows("`key`")+where+" ORDER BY name, `key`, shard"+forUpdate(lock), args...)
			if err != nil {
				return nil, err
			}
			defer rs.Close()
			var out []row
			for rs.Next() {
				var x row
				var paused sql.NullTime
				if err := rs.Scan(&x.Name, &x.Key, &x.Shard, &x.Value, &x.Prev, &x.TS, &paused); err != nil {
					return nil, err
				}
				x.TS = x.TS.UTC()
				if paused.Valid {
					x.Paused = paused.Time.UTC()
				}
				out = append(out, x)
			}
			return out, rs.Err()
		},
		now: func(ctx context.Context, tx *sql.Tx) (t time.Time, err error) {
			// mysqlstore decides with the server's UTC_TIMESTAMP(6).
			err = tx.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t)
			return t.UTC(), err
		},
		close:  func() { _ = db.Close() },
		opened: fmt.Sprintf("%s: MySQL or MariaDB at %s, database %s", mysqlStore, cfg.Addr, cfg.DBName),
	}, nil
}
