package pgsqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The PostgreSQL protocol (internal/pgproto) and the code sqlc generates for
// it speak pgx: Exec, Query and QueryRow, and SendBatch for statements that
// pgx sends in one round trip. sqlTx runs them on database/sql, one
// statement per round trip, which is all database/sql can do; this file is
// the whole difference between pgsqlstore and pgstore. The arguments are
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

// SendBatch runs the batch's statements one after another, each when its
// result is read, as pgx reads a batch's results in order. A batch of
// statements without arguments (the savepoint's rollback and release) goes
// in one round trip, as pgx sends it: one query of all of them, which every
// driver sends with the simple protocol.
func (t sqlTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	texts := make([]string, len(b.QueuedQueries))
	for i, q := range b.QueuedQueries {
		if len(q.Arguments) > 0 {
			return &sqlBatch{ctx: ctx, tx: t, queue: b.QueuedQueries}
		}
		texts[i] = q.SQL
	}
	_, err := t.q.ExecContext(ctx, strings.Join(texts, "; "))
	return &sqlBatch{ctx: ctx, tx: t, ran: len(texts), err: err}
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

// sqlBatch runs the statements of a batch as their results are read. After
// a statement fails it runs no more: the transaction has failed anyway. The
// embedded pgx.BatchResults is nil, as in sqlRows.
type sqlBatch struct {
	pgx.BatchResults
	ctx   context.Context
	tx    sqlTx
	queue []*pgx.QueuedQuery
	ran   int // statements SendBatch ran, whose results are next
	err   error
}

var errBatchDone = errors.New("txlimit/pgsqlstore: internal error: no statement left in the batch")

func (b *sqlBatch) next() (*pgx.QueuedQuery, error) {
	switch {
	case b.err != nil:
		return nil, b.err
	case len(b.queue) == 0:
		return nil, errBatchDone
	}
	q := b.queue[0]
	b.queue = b.queue[1:]
	return q, nil
}

// fail records the first error.
func (b *sqlBatch) fail(err error) error {
	if b.err == nil && err != nil {
		b.err = err
	}
	return err
}

func (b *sqlBatch) Exec() (pgconn.CommandTag, error) {
	if b.ran > 0 {
		b.ran--
		return pgconn.CommandTag{}, b.err
	}
	q, err := b.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := b.tx.Exec(b.ctx, q.SQL, q.Arguments...)
	return tag, b.fail(err)
}

func (b *sqlBatch) Query() (pgx.Rows, error) {
	q, err := b.next()
	if err != nil {
		return nil, err
	}
	rows, err := b.tx.Query(b.ctx, q.SQL, q.Arguments...)
	return rows, b.fail(err)
}

func (b *sqlBatch) QueryRow() pgx.Row {
	q, err := b.next()
	if err != nil {
		return errRow{err}
	}
	return b.tx.QueryRow(b.ctx, q.SQL, q.Arguments...)
}

// Close runs the statements whose results were not read.
func (b *sqlBatch) Close() error {
	b.ran = 0
	for len(b.queue) > 0 && b.err == nil {
		if _, err := b.Exec(); err != nil {
			return err
		}
	}
	return b.err
}

// errRow is a pgx.Row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
