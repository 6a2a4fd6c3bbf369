package txlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/migrations"
)

// appDB is what TestIntegration's application needs of its database: its
// own transactions, of the store's type TTx, and a *sql.DB for goose and
// for reading its tables. Queries are written with ? placeholders.
type appDB[TTx any] struct {
	dialect    migrations.Dialect
	goose      goose.Dialect
	db         *sql.DB
	newLimiter func(map[string]txlimit.Config, *txlimit.Options) (*txlimit.Limiter[TTx], error)
	begin      func(context.Context) (TTx, error)
	exec       func(ctx context.Context, tx TTx, query string, args ...any) (rowsAffected int64, err error)
	commit     func(context.Context, TTx) error
	rollback   func(context.Context, TTx) error
}

// sqlApp is an appDB on database/sql, for a store on db.
func sqlApp(db *sql.DB, dialect migrations.Dialect, gd goose.Dialect, store driver.Store[*sql.Tx]) *appDB[*sql.Tx] {
	return &appDB[*sql.Tx]{
		dialect: dialect, goose: gd, db: db,
		newLimiter: func(limits map[string]txlimit.Config, opts *txlimit.Options) (*txlimit.Limiter[*sql.Tx], error) {
			return txlimit.New(store, limits, opts)
		},
		begin: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		exec: func(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
			if dialect == migrations.Postgres {
				query = dollars(query)
			}
			res, err := tx.ExecContext(ctx, query, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
	}
}

// openSQL opens a *sql.DB, closed when t ends.
func openSQL(t *testing.T, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// beginTx begins a transaction, rolled back when t ends if it has not
// ended by then, so that a failed assertion leaks no connection or lock.
func (a *appDB[TTx]) beginTx(t *testing.T) TTx {
	t.Helper()
	tx, err := a.begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.rollback(context.Background(), tx) })
	return tx
}

// inTx runs fn in a transaction of the application's own, committed when fn
// returns nil and rolled back otherwise.
func (a *appDB[TTx]) inTx(ctx context.Context, fn func(TTx) error) error {
	tx, err := a.begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = a.rollback(ctx, tx)
		return err
	}
	return a.commit(ctx, tx)
}

// count runs a query that counts, outside any transaction.
func (a *appDB[TTx]) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, a.db.QueryRowContext(context.Background(), a.rebind(query), args...).Scan(&n), query)
	return n
}

// remaining is what the limit holds for key now, read without taking.
func (a *appDB[TTx]) remaining(t *testing.T, l *txlimit.Limiter[TTx], name, key string) float64 {
	t.Helper()
	res, err := l.Check(context.Background(), name, key, txlimit.Count(0))
	require.NoError(t, err)
	return res.Remaining
}

// rebind writes query's placeholders as the dialect wants them.
func (a *appDB[TTx]) rebind(query string) string {
	if a.dialect == migrations.Postgres {
		return dollars(query)
	}
	return query
}

// keyColumn is the txlimit table's key column, quoted where it must be.
func (a *appDB[TTx]) keyColumn() string {
	if a.dialect == migrations.MySQL {
		return "`key`"
	}
	return "key"
}

// dollars writes the ? placeholders of query as PostgreSQL's $1, $2, ...
func dollars(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
