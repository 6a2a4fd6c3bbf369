package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The PostgreSQL protocol (internal/pgproto) and the code sqlc generates for
// it speak pgx: Exec, Query and QueryRow. sqlTx runs them on database/sql,
// one statement per round trip, which is all database/sql can do (pgproto.Send
// runs a batch one statement after another on it); this file is the whole
// difference between pgsqlstore and pgstore. The arguments are
// those of sqlc's pgx code (strings, numbers, time.Time and pointers to
// them; arrays travel as text literals), which database/sql passes to any
// driver, and the rows scan into the same types.

// querier is a *sql.Tx, or the *sql.DB for Ping.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlTx is a querier as a pgproto.DB.
type sqlTx struct{ q querier }

func (t sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.q.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	// The generated code reads only the number of rows, which a command
	// tag ends with; a driver that cannot tell says 0.
	n, err := res.RowsAffected()
	if err != nil {
		n = 0
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

func (t sqlTx) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := t.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows: rows}, nil
}

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return sqlRow{t.q.QueryRowContext(ctx, query, args...)}
}

// sqlRow is a *sql.Row as a pgx.Row: no row is pgx.ErrNoRows.
type sqlRow struct{ row *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// sqlRows is *sql.Rows as pgx.Rows, for the methods the generated code
// calls (Next, Scan, Err, Close). The embedded pgx.Rows is nil: it stands in
// for the methods nothing here calls, so that a pgx that adds one to the
// interface still compiles (calling one would panic).
type sqlRows struct {
	pgx.Rows
	rows *sql.Rows
}

func (r sqlRows) Next() bool             { return r.rows.Next() }
func (r sqlRows) Scan(dest ...any) error { return r.rows.Scan(dest...) }
func (r sqlRows) Err() error             { return r.rows.Err() }
func (r sqlRows) Close()                 { _ = r.rows.Close() }
