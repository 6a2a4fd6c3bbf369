package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgproto and the code sqlc generates for it speak pgx (Exec, Query,
// QueryRow); sqlTx runs them on database/sql, one statement per round trip.
// This file is the whole difference between pgsqlstore and pgstore. sqlc's
// arguments (strings, numbers, time.Time, pointers to them, arrays as text
// literals) pass to any database/sql driver, and the rows scan alike.

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
	// The generated code reads only the number of rows (0 when the driver
	// cannot tell).
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
// calls. The embedded pgx.Rows is nil: it stands in for the others, which
// would panic.
type sqlRows struct {
	pgx.Rows
	rows *sql.Rows
}

func (r sqlRows) Next() bool             { return r.rows.Next() }
func (r sqlRows) Scan(dest ...any) error { return r.rows.Scan(dest...) }
func (r sqlRows) Err() error             { return r.rows.Err() }
func (r sqlRows) Close()                 { _ = r.rows.Close() }
