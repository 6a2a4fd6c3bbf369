package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// queuer is a db.DBTX that queues the statement a generated method would
// send into a batch instead of sending it, so that every statement of a
// batch is bound by sqlc's generated code, in its argument order. The
// generated method then returns errQueued (queued turns it into nil); the
// caller reads the results from the batch, scanning the columns in the order
// of the generated row type.
type queuer struct{ b *pgx.Batch }

var errQueued = errors.New("pgstore: statement queued")

func (q queuer) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(sql, args...)
	return pgconn.CommandTag{}, errQueued
}

func (q queuer) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.b.Queue(sql, args...)
	return nil, errQueued
}

func (q queuer) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.b.Queue(sql, args...)
	return queuedRow{}
}

type queuedRow struct{}

func (queuedRow) Scan(...any) error { return errQueued }

// queued returns nil for the errQueued of a generated method called on a
// queuer, and any other error as it is.
func queued(err error) error {
	if errors.Is(err, errQueued) {
		return nil
	}
	if err == nil {
		return errors.New("pgstore: internal error: a generated method did not reach its queuer")
	}
	return err
}
