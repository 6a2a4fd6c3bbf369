package pgproto

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// Denied is txlimit's own SQLSTATE, raised by txlimit_deny (migration
// 00005) where a take sent with must would grant nothing.
const Denied = "TXL01"

// mustDB runs the one-statement takes with must: each /*must*/ marker of
// their SQL (queries/postgres) replaced by OR txlimit_deny(), so that a take
// that would return no row raises Denied instead (without must the
// statements leave out the function, which costs every execution that
// names it). A statement without the marker is an internal error, not sent:
// the statements after it would run without its tokens. The takes return
// one row (QueryRow); Exec and Query send nothing.
type mustDB struct{ db pgdb.DBTX }

const mustMarker = "/*must*/"

func (m mustDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !strings.Contains(sql, mustMarker) {
		return errRow{errors.New("txlimit/pgproto: internal error: a take sent with must lacks the " + mustMarker + " marker")}
	}
	return m.db.QueryRow(ctx, strings.ReplaceAll(sql, mustMarker, "OR txlimit_deny()"), args...)
}

var errNotOneRow = errors.New("txlimit/pgproto: internal error: a take sent with must does not return one row")

func (mustDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotOneRow
}

func (mustDB) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errNotOneRow }

// Lean reports whether every take of p can ride the COMMIT (TakeCommit) or
// the caller's batch (TakeBatch): each is one statement, an unsharded limit
// whose call the SQL decides (driver.InSQL).
func Lean(p driver.TakeAllParams) bool {
	return !slices.ContainsFunc(p.Takes, func(t driver.TakeParams) bool { return t.Shards != 1 || !driver.InSQL(t) })
}

// TakeCommit is driver.Ops.Commit for takes that are Lean, on a connection
// whose transaction db is: each take, in the canonical order, with must
// set, and then COMMIT, in one round trip where db pipelines. A take that
// would grant nothing raises Denied, and the server skips every statement
// after it, the COMMIT included: the transaction commits with every take
// or nothing of it remains, and each limit then gets the decision Check
// would give it (deniedAtCommit).
//
// An error the server reported means that the transaction did not commit;
// it is rolled back and returned. Any other error after the statements
// were sent (a connection lost, a context cancelled mid-flight) leaves the
// outcome unknown: the error matches driver.ErrCommitUnknown.
func (pr Protocol) TakeCommit(ctx context.Context, db DB, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	out, calls := mustTakes(ctx, p)
	calls = append(calls, Exec(ctx, "COMMIT"))
	lt := engine.LockTimer{On: p.TimeLocks}
	start := lt.Start()
	err := Send(ctx, db, calls...)
	lt.Stop(start)
	out.LockWait = lt.Total
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return *out, nil
	case isDenied(err):
		return pr.deniedAtCommit(ctx, db, p)
	case errors.As(err, &pgErr) || pgconn.SafeToRetry(err):
		// The server refused a statement (the transaction is aborted, or
		// the COMMIT itself failed and ended it), or nothing was sent.
		_ = Send(ctx, db, Exec(ctx, "ROLLBACK"))
		return driver.TakeAllResult{}, err
	}
	return driver.TakeAllResult{}, fmt.Errorf("%w: %w", driver.ErrCommitUnknown, err)
}

// TakeBatch is pgstore's SendBatch for takes that are Lean: the takes as
// TakeCommit sends them, with the statements of b and their callbacks in
// place of COMMIT. After a denial none of b's statements takes effect and
// none of their callbacks is called; the transaction is rolled back on the
// server and the limits decided as TakeCommit decides them, while db's own
// bookkeeping of the transaction is the caller's to end.
//
// err is the takes' error: it leaves the transaction aborted or the
// connection broken. batchErr is the error of b's statements after the
// takes granted, as their callbacks or pgx's Close returned it. The
// result's LockWait is the whole batch's, b's statements included.
func (pr Protocol) TakeBatch(ctx context.Context, db DB, p driver.TakeAllParams, b *pgx.Batch) (res driver.TakeAllResult, batchErr, err error) {
	out, calls := mustTakes(ctx, p)
	lt := engine.LockTimer{On: p.TimeLocks}
	start := lt.Start()
	err, batchErr = send(ctx, db, calls, b.QueuedQueries)
	lt.Stop(start)
	out.LockWait = lt.Total
	switch {
	case err == nil:
		return *out, batchErr, nil
	case isDenied(err):
		res, err = pr.deniedAtCommit(ctx, db, p)
		return res, nil, err
	}
	return driver.TakeAllResult{}, nil, err
}

// mustTakes are the calls that take p with must, in the canonical order,
// and the result they fill in as the batch's results are read.
func mustTakes(ctx context.Context, p driver.TakeAllParams) (*driver.TakeAllResult, []Call) {
	out := &driver.TakeAllResult{OK: true, Results: make([]driver.TakeResult, len(p.Takes))}
	calls := make([]Call, 0, len(p.Takes)+1)
	for _, i := range driver.CanonicalOrder(p.Takes) {
		t := p.Takes[i]
		t.Now = p.Now
		calls = append(calls, func(q pgdb.DBTX) error {
			next, clock, ok, err := TakeRow(ctx, q, t, true)
			if err == nil && !ok {
				// With must the statement returns a row or raises
				// (TestTakeRowMatchesAlgo holds it to that). Were it to
				// return none, the statements after it (the COMMIT, the
				// caller's) would have run: say so.
				return errors.New("txlimit/pgproto: internal error: a take sent with must returned no row, " +
					"and the statements after it ran without its tokens")
			}
			out.Results[i] = driver.TakeResult{Decision: driver.Granted(t.Config, next, clock.UnixMicro()), At: clock, States: []algo.State{next}}
			out.At = clock
			return err
		})
	}
	return out, calls
}

// isDenied reports whether err is the Denied a take sent with must raised.
func isDenied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == Denied
}

// deniedAtCommit ends the transaction a denied TakeCommit or TakeBatch left
// aborted and decides each limit of p as Check would (two more round
// trips), on the committed rows, read in a transaction of their own that it
// ends too. When none of them then denies, the SQL refused what algo would
// grant now: tokens that came in since, or rows the one-statement take
// leaves to the Go path (those of a limit whose Shards was lowered), which
// rewrite rewrites so that the next call can ride the COMMIT; the call is
// reported denied with RetryAfter 0: try again.
//
// The reads must not run outside a transaction: behind a pooler in
// transaction mode (PgBouncer) a connection goes back to the pool after
// each round trip, and pgx sends a statement outside a batch, in
// QueryExecModeDescribeExec, in two (prepare the unnamed statement; bind
// and execute), so the second may reach another server connection, which
// has no unnamed statement (26000) or another client's (08P01, or run in
// place of the read when its parameters fit).
func (pr Protocol) deniedAtCommit(ctx context.Context, db DB, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	// The ROLLBACK goes before the reads, which the aborted transaction
	// would not prepare (pgx prepares uncached statements first), with
	// their BEGIN in one simple query: no round trip of its own.
	if _, err := db.Exec(ctx, "ROLLBACK; BEGIN"); err != nil {
		return driver.TakeAllResult{}, err
	}
	out := driver.TakeAllResult{Results: make([]driver.TakeResult, len(p.Takes))}
	calls := make([]Call, 0, len(p.Takes)+1)
	for i, t := range p.Takes {
		calls = append(calls, func(q pgdb.DBTX) error {
			read, err := dialect(pr).Read(ctx, q, driver.ReadParams{Name: t.Name, Key: t.Key, Now: p.Now})
			if err == nil {
				out.Results[i], out.At = driver.Check(t, read), read.At
			}
			return err
		})
	}
	// They only read: the ROLLBACK that ends their transaction rides with
	// them.
	calls = append(calls, Exec(ctx, "ROLLBACK"))
	if err := Send(ctx, db, calls...); err != nil {
		// A read failed, and the server skipped the ROLLBACK after it.
		_, _ = db.Exec(ctx, "ROLLBACK")
		return driver.TakeAllResult{}, err
	}
	if slices.ContainsFunc(out.Results, func(r driver.TakeResult) bool { return !r.Decision.OK }) {
		return out, nil
	}
	for i := range out.Results {
		out.Results[i].Decision = algo.Decision{} // denied, RetryAfter 0
	}
	return out, pr.rewrite(ctx, db, p)
}

// rewrite takes nothing from every limit of p, through the locked path of
// TakeAll, in a transaction of its own on db's connection: it rewrites rows
// the one-statement take cannot decide on (those of another Shards) as
// algo's, and changes no decision.
func (pr Protocol) rewrite(ctx context.Context, db DB, p driver.TakeAllParams) error {
	zero := driver.TakeAllParams{Takes: make([]driver.TakeParams, len(p.Takes)), Now: p.Now}
	for i, t := range p.Takes {
		t.Count = 0
		zero.Takes[i] = t
	}
	if _, err := db.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	_, err := pr.TakeAll(ctx, db, zero)
	end := "COMMIT"
	if err != nil {
		end = "ROLLBACK"
	}
	if _, cerr := db.Exec(ctx, end); err == nil {
		err = cerr
	}
	return err
}
