// Package pgproto is the PostgreSQL store of txlimit, shared by pgstore (pgx)
// and pgsqlstore (database/sql): the engine's row operations (package
// engine) on the statements sqlc generates from queries/postgres (package
// pgdb), and the take at COMMIT and in the caller's batch. The statements
// of one operation go through Send, in one round trip where the DB
// pipelines.
package pgproto

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// DB is a transaction as the protocol runs statements in it: pgx's
// Exec/Query/QueryRow, what the generated code calls. pgx.Tx is one, which
// pipelines (a batcher); pgsqlstore adapts a *sql.Tx.
type DB = pgdb.DBTX

// batcher is a DB that sends a batch of statements in one round trip.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Protocol runs the operations of driver.Ops on a DB. Its zero value is the
// default.
type Protocol struct {
	// SingleKey makes every statement that locks or writes rows touch the
	// rows of one (name, key): the stores' SingleKeyStatements option, for
	// a table distributed by key (Citus).
	SingleKey bool
}

// queries runs the generated statements; it holds no state.
var queries = pgdb.New()

// The savepoint of the sharded fast path (dialect.TryShard, KeepShards,
// LetGo).
const (
	savepoint = "SAVEPOINT txlimit_try"
	release   = "RELEASE SAVEPOINT txlimit_try"
	rollback  = "ROLLBACK TO SAVEPOINT txlimit_try"
)

// Call is one statement, made by a generated method (or an Exec) on q: a
// closure that keeps what the statement returns. Send makes it twice when
// it batches, first on a queuer, which records the statement, then on a
// replay, which hands the generated method its result from the batch: the
// generated code both binds the arguments and scans the rows.
type Call func(q pgdb.DBTX) error

// Send runs calls in order, in one round trip where db pipelines. A single
// call is sent alone: a batch costs pgx more than a statement. The error is
// the first call's that failed, once every result has been read. On a db
// that cannot pipeline, the calls run one after another until one fails,
// and calls without arguments (a savepoint's rollback and release) go in
// one simple query, as pgx would batch them.
func Send(ctx context.Context, db DB, calls ...Call) error {
	switch _, pipelines := db.(batcher); {
	case len(calls) == 0:
		return nil
	case len(calls) == 1:
		return calls[0](db)
	case pipelines:
		err, tailErr := send(ctx, db, calls, nil)
		return cmp.Or(err, tailErr)
	}
	b := &pgx.Batch{}
	var texts []string
	for _, c := range calls {
		if err := queued(c(queuer{b})); err != nil {
			return err
		}
		if q := b.QueuedQueries[len(b.QueuedQueries)-1]; len(q.Arguments) == 0 {
			texts = append(texts, q.SQL)
		}
	}
	if len(texts) == len(calls) {
		_, err := db.Exec(ctx, strings.Join(texts, "; "))
		return err
	}
	for _, c := range calls {
		if err := c(db); err != nil {
			return err
		}
	}
	return nil
}

// send sends calls and then tail, queued queries of a batch built
// elsewhere, in one batch on db. err is the first call's error; tailErr is
// tail's (their callbacks', the batch's as Close reports it, or pgx's when
// it could not prepare or encode one of them, and nothing ran), once every
// result has been read. After a call failed, no callback of tail runs.
func send(ctx context.Context, db DB, calls []Call, tail []*pgx.QueuedQuery) (err, tailErr error) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(calls)+len(tail))}
	for _, c := range calls {
		if err := queued(c(queuer{b})); err != nil {
			return err, nil
		}
	}
	failed := false
	for _, q := range tail {
		q := *q // the caller's batch is left as it was
		if fn := q.Fn; fn != nil {
			q.Fn = func(br pgx.BatchResults) error {
				if failed {
					return errSkipped
				}
				return fn(br)
			}
		}
		b.QueuedQueries = append(b.QueuedQueries, &q)
	}
	res := db.(batcher).SendBatch(ctx, b)
	for _, c := range calls {
		if err = c(replay{res}); err != nil {
			// Close reads the results left and runs their callbacks.
			failed = true
			break
		}
	}
	tailErr = res.Close()
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) && slices.ContainsFunc(b.QueuedQueries[len(calls):], func(q *pgx.QueuedQuery) bool { return q.SQL == pre.SQL() }) {
		// pgx prepares and encodes every statement before it runs any,
		// and reports a statement of tail it could not as the first
		// result's error: nothing ran, and the error is tail's.
		return nil, err
	}
	return err, tailErr
}

// errSkipped is what the callback of a statement queued after a call that
// failed returns instead of running.
var errSkipped = errors.New("txlimit/pgproto: a statement before this one in the batch failed")

// Exec is the Call of a statement without parameters or result.
func Exec(ctx context.Context, sql string) Call {
	return func(q pgdb.DBTX) error {
		_, err := q.Exec(ctx, sql)
		return err
	}
}

// queuer is a pgdb.DBTX that queues the statement a generated method would
// send into a batch instead of sending it. The method then returns
// errQueued, which queued turns into nil.
type queuer struct{ b *pgx.Batch }

var errQueued = errors.New("txlimit/pgproto: statement queued")

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
	return errRow{errQueued}
}

// errRow is a pgx.Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// queued returns nil for the errQueued of a call made on a queuer, and any
// other error as it is.
func queued(err error) error {
	if errors.Is(err, errQueued) {
		return nil
	}
	if err == nil {
		return errors.New("txlimit/pgproto: internal error: a statement did not reach its queuer")
	}
	return err
}

// replay is a pgdb.DBTX whose methods return the next result of a sent batch
// instead of sending their statement, which the queuer already queued.
type replay struct{ res pgx.BatchResults }

func (r replay) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) { return r.res.Exec() }
func (r replay) Query(context.Context, string, ...any) (pgx.Rows, error)         { return r.res.Query() }
func (r replay) QueryRow(context.Context, string, ...any) pgx.Row                { return r.res.QueryRow() }

// Ops is the part of driver.Ops that pgstore and pgsqlstore run alike: the
// Protocol on their driver's transaction as a DB (AsDB), each error mapped
// by the store (Err: what the user must do about it).
type Ops[TTx any] struct {
	Proto Protocol
	AsDB  func(TTx) DB
	Err   func(ctx context.Context, tx TTx, err error) error
}

func (o *Ops[TTx]) Take(ctx context.Context, tx TTx, p driver.TakeParams) (driver.TakeResult, error) {
	res, err := o.Proto.Take(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) TakeAll(ctx context.Context, tx TTx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	res, err := o.Proto.TakeAll(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) Read(ctx context.Context, tx TTx, p driver.ReadParams) (driver.ReadResult, error) {
	res, err := dialect(o.Proto).Read(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) Credit(ctx context.Context, tx TTx, p driver.CreditParams) error {
	return o.Err(ctx, tx, engine.Credit[DB](ctx, dialect(o.Proto), o.AsDB(tx), p))
}

func (o *Ops[TTx]) Reset(ctx context.Context, tx TTx, k driver.KeyRef) error {
	return o.Err(ctx, tx, queries.DeleteKey(ctx, o.AsDB(tx), pgdb.DeleteKeyParams{Name: k.Name, Key: k.Key}))
}

func (o *Ops[TTx]) Pause(ctx context.Context, tx TTx, p driver.PauseParams) error {
	return o.Err(ctx, tx, engine.Pause[DB](ctx, dialect(o.Proto), o.AsDB(tx), p))
}

// ClockRange is driver.ClockRanger's: timestamptz holds 4713 BC to 294276
// AD, and the instants are microseconds in an int64, which end before that.
func (o *Ops[TTx]) ClockRange() (first, last time.Time) {
	return time.Date(-4712, time.January, 1, 0, 0, 0, 0, time.UTC), driver.Microseconds[1]
}

// MapErr adds to err, an error of a PostgreSQL store, what the user must do
// about it, keeping err reachable with errors.As: a missing or outdated
// table matches driver.ErrNotMigrated, and a prepared statement lost between
// transactions (PgBouncer in transaction mode) says what to set (fix).
func MapErr(err error, store, fix string) error {
	if errors.Is(err, driver.ErrNotMigrated) {
		return err // named already: the error was mapped before
	}
	code, _ := SQLState(err)
	switch code {
	case UndefinedTable, UndefinedColumn:
		return fmt.Errorf("%w: %w", driver.ErrNotMigrated, err)
	case DuplicatePreparedStatement, InvalidSQLStatementName:
		return driver.Setup(fmt.Errorf("txlimit/%s: a prepared statement was lost between transactions, as happens behind PgBouncer "+
			"in transaction mode with pgx's default exec mode%s: %w", store, fix, err))
	}
	return err
}
