package pgstore_test

// The take in the caller's own batch (txlimit.SendBatch) on a real
// PostgreSQL: what it costs on the wire beside LimitTx, what a grant, a
// denial, a failed statement of the caller's, a lost connection and a
// cancelled context leave behind, the two-step path of limits that are not
// one statement, and exact admission on a hot key. The caller's work is a
// row of the business table orders (commitEnv): it exists if and only if
// its transaction committed.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// orderBatch is a batch whose one statement inserts order *id, a new id,
// with a callback that sets *ran.
func (e *commitEnv) orderBatch(id *int64, ran *bool) *pgx.Batch {
	*id = e.ids.Add(1)
	return insertBatch(*id, ran)
}

func insertBatch(id int64, ran *bool) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO orders (id) VALUES ($1)`, id).Exec(func(pgconn.CommandTag) error {
		*ran = true
		return nil
	})
	return b
}

// begin begins a transaction on e's pool, rolled back at the end of t if
// it is still open.
func (e *commitEnv) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := e.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// sendOrder is a business transaction: BEGIN, the batch of order *id with
// the takes of reqs, and COMMIT when they granted.
func (e *commitEnv) sendOrder(ctx context.Context, l *txlimit.Limiter[pgx.Tx], id *int64, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return txlimit.MultiResult{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var ran bool
	res, err := pgstore.SendBatch(ctx, l, tx, e.orderBatch(id, &ran), reqs...)
	if err != nil {
		return res, err
	}
	if !ran {
		return res, errors.New("the batch's callback did not run")
	}
	return res, tx.Commit(ctx)
}

// TestBatchGrant: a grant runs the batch's statement and its callback in
// tx, after the take; the order and the tokens commit together, and a
// rollback takes both back.
func TestBatchGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "grant")
	e := newCommitEnv(t, 2, nil, map[string]txlimit.Config{name: window(5)})

	tx := e.begin(t)
	var id int64
	var ran bool
	res, err := pgstore.SendBatch(ctx, e.l, tx, e.orderBatch(&id, &ran), commitReq(name, "k", txlimit.Count(2)))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Len(t, res.Results, 1)
	require.True(t, res.Results[0].OK)
	require.Equal(t, 2.0, res.Results[0].Taken)
	require.Equal(t, 3.0, res.Results[0].Remaining)
	require.True(t, ran, "the batch's callback ran")

	// In tx, the order and the take; outside, neither before the commit.
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)
	snap, err := e.l.CheckTx(ctx, tx, name, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.Equal(t, 3.0, snap.Remaining)
	require.False(t, e.committed(t, id))
	require.Equal(t, 5.0, e.value(t, name, "k"))
	require.NoError(t, tx.Commit(ctx))
	require.True(t, e.committed(t, id))
	require.Equal(t, 3.0, e.value(t, name, "k"))

	// Rolled back, the order and the tokens go.
	tx = e.begin(t)
	ran = false
	res, err = pgstore.SendBatch(ctx, e.l, tx, e.orderBatch(&id, &ran), commitReq(name, "k", txlimit.Count(2)))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, 1.0, res.Results[0].Remaining)
	require.True(t, ran)
	require.NoError(t, tx.Rollback(ctx))
	require.False(t, e.committed(t, id))
	require.Equal(t, 3.0, e.value(t, name, "k"), "the tokens came back with the rollback")

	// An empty batch takes the limits alone.
	tx = e.begin(t)
	res, err = pgstore.SendBatch(ctx, e.l, tx, &pgx.Batch{}, commitReq(name, "k"))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2.0, e.value(t, name, "k"))
	e.settled(t)
}

// TestBatchDenied, in every exec mode: a denial stops the batch before its
// statements take effect and before their callbacks run, rolls tx back,
// reports the RetryAfter Check gives, and gives the connection back to
// the pool, ready for the next call.
func TestBatchDenied(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	admin := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	_, err := admin.Exec(context.Background(), `CREATE TABLE orders (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	var ids atomic.Int64
	committed := func(t *testing.T, id int64) bool {
		var n int
		require.NoError(t, admin.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE id = $1`, id).Scan(&n))
		return n == 1
	}
	for _, mode := range testdb.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t, schema, mode, 1)
			clk := storetest.NewClock()
			name := storetest.UniqueName(t, "deny")
			var mu sync.Mutex
			var events []txlimit.Event
			// One call a minute, in windows that start at T0.
			l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
				name: {Kind: txlimit.FixedWindow, Rate: 1, Period: time.Minute, Start: storetest.T0},
			}, &txlimit.Options{Clock: clk.Now, Observer: storetest.ObserverFunc(func(_ context.Context, ev txlimit.Event) {
				mu.Lock()
				defer mu.Unlock()
				events = append(events, ev)
			})})
			require.NoError(t, err)
			send := func(id int64, queue func(b *pgx.Batch)) (pgx.Tx, txlimit.MultiResult, error) {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(ctx) })
				b := &pgx.Batch{}
				b.Queue(`INSERT INTO orders (id) VALUES ($1)`, id)
				queue(b)
				res, err := pgstore.SendBatch(ctx, l, tx, b, commitReq(name, "k"))
				return tx, res, err
			}
			nothing := func(*pgx.Batch) {}

			granted := ids.Add(1)
			tx, res, err := send(granted, nothing)
			require.NoError(t, err)
			require.True(t, res.OK)
			require.NoError(t, tx.Commit(ctx))
			pid := tx.Conn().PgConn().PID()

			clk.Advance(15 * time.Second)
			denied := ids.Add(1)
			var execRan, rowRan bool
			tx, res, err = send(denied, func(b *pgx.Batch) {
				// pgx itself would call a QueryRow callback after an
				// error in the simple protocol, with the error in its row.
				b.Queue(`SELECT count(*) FROM orders`).QueryRow(func(row pgx.Row) error {
					rowRan = true
					return row.Scan(new(int))
				})
				b.Queue(`INSERT INTO orders (id) VALUES ($1)`, -denied).Exec(func(pgconn.CommandTag) error {
					execRan = true
					return nil
				})
			})
			mu.Lock()
			last := events[len(events)-1]
			mu.Unlock()
			require.Equal(t, "batch", last.Op)
			require.Equal(t, "denied", last.Outcome)
			require.NoError(t, last.Err)
			var rl *txlimit.RateLimitedError
			require.ErrorAs(t, err, &rl)
			require.Equal(t, name, rl.Name)
			require.Equal(t, 45*time.Second, rl.RetryAfter, "the rest of the window")
			require.False(t, res.OK)
			require.Equal(t, rl.RetryAfter, res.RetryAfter)
			require.Len(t, res.Results, 1)
			require.False(t, res.Results[0].OK)
			require.Zero(t, res.Results[0].Taken)
			require.False(t, execRan, "no callback of the batch ran")
			require.False(t, rowRan, "no callback of the batch ran")
			require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed, "the denial rolled tx back")
			require.False(t, committed(t, denied), "the batch's statements did not take effect")
			require.False(t, committed(t, -denied))
			check, err := l.Check(ctx, name, "k")
			require.NoError(t, err)
			require.Equal(t, check.RetryAfter, rl.RetryAfter, "the RetryAfter Check gives")
			require.Zero(t, pool.Stat().AcquiredConns(), "the connection went back")

			// The next window: the same connection, out of any transaction,
			// takes the next call.
			clk.Advance(45 * time.Second)
			next := ids.Add(1)
			tx, res, err = send(next, nothing)
			require.NoError(t, err)
			require.True(t, res.OK)
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, pid, tx.Conn().PgConn().PID(), "the same connection (MaxConns 1)")
			require.True(t, committed(t, granted))
			require.True(t, committed(t, next))
		})
	}
}

// TestBatchAllOrNone: several limits are taken all or none, in whatever
// order the requests name them, with Count; the denial names the limit
// that denied, and each Result is its limit's own.
func TestBatchAllOrNone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b")
	e := newCommitEnv(t, 2, nil, map[string]txlimit.Config{a: window(5), b: window(1)})

	var id int64
	res, err := e.sendOrder(ctx, e.l, &id, commitReq(b, "k"), commitReq(a, "k", txlimit.Count(2)))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, []float64{1, 2}, []float64{res.Results[0].Taken, res.Results[1].Taken})
	require.True(t, e.committed(t, id))

	res, err = e.sendOrder(ctx, e.l, &id, commitReq(b, "k"), commitReq(a, "k", txlimit.Count(2)))
	var rl *txlimit.RateLimitedError
	require.ErrorAs(t, err, &rl)
	require.Equal(t, b, rl.Name)
	require.False(t, res.OK)
	require.False(t, res.Results[0].OK, "b denies")
	require.True(t, res.Results[1].OK, "a alone would grant")
	require.Zero(t, res.Results[0].Taken)
	require.Zero(t, res.Results[1].Taken, "nothing was taken from a")
	require.Equal(t, res.Results[0].RetryAfter, res.RetryAfter)
	require.Positive(t, res.RetryAfter)
	require.False(t, e.committed(t, id))
	require.Equal(t, 3.0, e.value(t, a, "k"))
	require.Zero(t, e.value(t, b, "k"))

	// A count beyond what a holds denies; one that fits takes it all.
	_, err = e.sendOrder(ctx, e.l, &id, commitReq(a, "k", txlimit.Count(4)))
	require.ErrorIs(t, err, txlimit.ErrRateLimited)
	require.False(t, e.committed(t, id))
	res, err = e.sendOrder(ctx, e.l, &id, commitReq(a, "k", txlimit.Count(3)))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.True(t, e.committed(t, id))
	require.Zero(t, e.value(t, a, "k"))
	require.Equal(t, 2, e.orders(t))
	e.settled(t)
}

// TestBatchTwoStep: limits that are not one statement (sharded, a sliding
// window) are taken first as LimitAllTx takes them, and the batch is sent
// once they granted; a denial sends no batch and rolls tx back.
func TestBatchTwoStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sharded, sliding := storetest.UniqueName(t, "sharded"), storetest.UniqueName(t, "sliding")
	e := newCommitEnv(t, 2, nil, map[string]txlimit.Config{
		sharded: {Kind: txlimit.TokenBucket, Rate: 4, Period: 1e4 * time.Hour, Shards: 4},
		sliding: {Kind: txlimit.SlidingWindow, Rate: 2, Period: time.Hour},
	})
	for _, tc := range []struct {
		name     string
		capacity int
	}{{sharded, 4}, {sliding, 2}} {
		for i := range tc.capacity {
			var id int64
			res, err := e.sendOrder(ctx, e.l, &id, commitReq(tc.name, "k"))
			require.NoError(t, err, "%s call %d", tc.name, i)
			require.True(t, res.OK)
			require.True(t, e.committed(t, id))
		}
		tx := e.begin(t)
		var id int64
		var ran bool
		res, err := pgstore.SendBatch(ctx, e.l, tx, e.orderBatch(&id, &ran), commitReq(tc.name, "k"))
		require.ErrorIs(t, err, txlimit.ErrRateLimited, tc.name)
		require.False(t, res.OK)
		require.Positive(t, res.RetryAfter)
		require.False(t, ran, "%s: the batch was not sent", tc.name)
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed, "%s: the denial rolled tx back", tc.name)
		require.False(t, e.committed(t, id))
	}
	require.Equal(t, 6, e.orders(t))
	require.InDelta(t, 0, e.value(t, sharded, "k"), 0.01, "a bucket refills a little")
	e.settled(t)
}

// TestBatchRoundTrips pins the wire cost: the batch with its takes costs
// what the same batch without a limit costs, one round trip less than
// LimitTx before it; limits that are not one statement add LimitAllTx's
// two.
func TestBatchRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	counter := &testdb.ReadyCounter{}
	a, b, sh := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b"), storetest.UniqueName(t, "sh")
	e := newCommitEnv(t, 1, counter.Conn, map[string]txlimit.Config{
		a:  window(1e6),
		b:  {Kind: txlimit.TokenBucket, Rate: 1e6, Period: 1e4 * time.Hour},
		sh: {Kind: txlimit.TokenBucket, Rate: 1e6, Period: 1e4 * time.Hour, Shards: 4},
	})
	var id int64
	batch := func() *pgx.Batch {
		id = e.ids.Add(1)
		return insertBatch(id, new(bool))
	}
	inTx := func(work func(tx pgx.Tx) error) func() error {
		return func() error {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := work(tx); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
	}
	sendBatch := func(reqs ...txlimit.Request) func() error {
		return inTx(func(tx pgx.Tx) error {
			_, err := pgstore.SendBatch(ctx, e.l, tx, batch(), reqs...)
			return err
		})
	}
	e.roundTrips(t, counter, "a pgx batch, no limit", 3, &id, inTx(func(tx pgx.Tx) error {
		return tx.SendBatch(ctx, batch()).Close()
	}))
	e.roundTrips(t, counter, "LimitTx, then the batch", 4, &id, inTx(func(tx pgx.Tx) error {
		res, err := e.l.LimitTx(ctx, tx, a, "lt")
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			return err
		}
		return tx.SendBatch(ctx, batch()).Close()
	}))
	e.roundTrips(t, counter, "SendBatch, one limit", 3, &id, sendBatch(commitReq(a, "k")))
	e.roundTrips(t, counter, "SendBatch, two limits", 3, &id, sendBatch(commitReq(a, "k2"), commitReq(b, "k")))
	e.roundTrips(t, counter, "SendBatch, a sharded limit", 5, &id, sendBatch(commitReq(sh, "k")))
	require.Equal(t, int64(1), e.pool.Stat().NewConnsCount(), "one connection did it all")
	require.Equal(t, 1e6-4, e.value(t, a, "k"))
	require.Equal(t, 1e6-4, e.value(t, a, "k2"))
	require.Equal(t, 1e6-4, e.value(t, a, "lt"))
	require.InDelta(t, 1e6-4, e.value(t, b, "k"), 1, "a bucket refills a little")
	require.InDelta(t, 1e6-4, e.value(t, sh, "k"), 1)
}

// TestBatchStatementError: a statement of the batch that fails after the
// take is the caller's error, returned as it is (not the store's
// ErrNotMigrated for a table of the caller's that is missing); the tokens
// the take left in tx go back with its rollback.
func TestBatchStatementError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "err")
	e := newCommitEnv(t, 2, nil, map[string]txlimit.Config{name: window(5)})
	var first int64
	_, err := e.sendOrder(ctx, e.l, &first, commitReq(name, "k"))
	require.NoError(t, err)

	boom := errors.New("the callback refuses")
	for _, tc := range []struct {
		what    string
		aborted bool // the server refused the statement: tx is aborted
		queue   func(b *pgx.Batch)
		check   func(t *testing.T, err error)
	}{
		{"a duplicate key", true, func(b *pgx.Batch) { b.Queue(`INSERT INTO orders (id) VALUES ($1)`, first) },
			func(t *testing.T, err error) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "23505", pgErr.Code)
			}},
		{"a callback's error", false, func(b *pgx.Batch) {
			b.Queue(`INSERT INTO orders (id) VALUES ($1)`, -first).Exec(func(pgconn.CommandTag) error { return boom })
		}, func(t *testing.T, err error) { require.ErrorIs(t, err, boom) }},
		{"a table of the caller's that is missing", true, func(b *pgx.Batch) { b.Queue(`INSERT INTO no_orders (id) VALUES (1)`) },
			func(t *testing.T, err error) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "42P01", pgErr.Code)
				require.NotErrorIs(t, err, txlimit.ErrNotMigrated)
			}},
	} {
		tx := e.begin(t)
		b := &pgx.Batch{}
		tc.queue(b)
		res, err := pgstore.SendBatch(ctx, e.l, tx, b, commitReq(name, "k"))
		tc.check(t, err)
		require.NotErrorIs(t, err, txlimit.ErrRateLimited, tc.what)
		require.False(t, res.OK, tc.what)
		if tc.aborted {
			require.Error(t, tx.Commit(ctx), "%s: tx cannot commit", tc.what)
		} else {
			// The statement ran; its callback refused: the caller's to
			// decide, and it rolls back.
			require.NoError(t, tx.Rollback(ctx), tc.what)
		}
		require.Equal(t, 4.0, e.value(t, name, "k"), "%s: the tokens went back", tc.what)
	}
	require.Equal(t, 1, e.orders(t))
	e.settled(t)
}

// TestBatchConnectionDropped: a connection lost once the batch is sent is
// an error, never an admission, and nothing of the transaction commits:
// not the order, not the token.
func TestBatchConnectionDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "drop")
	var armed atomic.Bool
	var executes atomic.Int64
	e := newCommitEnv(t, 1, func(c net.Conn) net.Conn {
		return &dropConn{Conn: c, armed: &armed, executes: &executes}
	}, map[string]txlimit.Config{name: window(10)})

	for i := range 3 {
		tx := e.begin(t)
		pid := tx.Conn().PgConn().PID()
		executes.Store(0)
		armed.Store(true)
		var id int64
		var ran bool
		res, err := pgstore.SendBatch(ctx, e.l, tx, e.orderBatch(&id, &ran), commitReq(name, "k"))
		require.False(t, armed.Load(), "iteration %d: the batch was never sent", i)
		require.Equal(t, int64(2), executes.Load(), "iteration %d: the batch dropped is the take and the INSERT", i)
		require.Error(t, err, "iteration %d", i)
		require.NotErrorIs(t, err, txlimit.ErrRateLimited, "iteration %d", i)
		require.NotErrorIs(t, err, txlimit.ErrCommitUnknown, "iteration %d: no COMMIT was sent", i)
		require.False(t, res.OK, "iteration %d: no admission reported", i)
		require.Empty(t, res.Results)
		require.Error(t, tx.Commit(ctx), "iteration %d: tx cannot commit", i)
		e.gone(t, pid)
		require.False(t, e.committed(t, id), "iteration %d", i)
		require.Equal(t, 10.0, e.value(t, name, "k"), "iteration %d: no token spent", i)
		e.settled(t)
	}
	var id int64
	_, err := e.sendOrder(ctx, e.l, &id, commitReq(name, "k"))
	require.NoError(t, err, "the pool recovers")
	require.True(t, e.committed(t, id))
	require.Equal(t, 9.0, e.value(t, name, "k"))
}

// TestBatchRefusedBeforeSending: bad input, a nil batch, a batch of
// another type, Reserve and UpTo, a savepoint for tx and a context already
// done are refused before anything is sent; tx goes on and commits its
// own work, with no token taken.
func TestBatchRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	counter := &testdb.ReadyCounter{}
	name := storetest.UniqueName(t, "refused")
	e := newCommitEnv(t, 1, counter.Conn, map[string]txlimit.Config{name: window(5)})

	tx := e.begin(t)
	nested, err := tx.Begin(ctx)
	require.NoError(t, err)
	var ran bool
	for _, tc := range []struct {
		what  string
		call  func() (txlimit.MultiResult, error)
		field string // of the *InvalidError; "" for another error
		want  string
	}{
		{"a nil batch", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, e.l, nested, (*pgx.Batch)(nil), commitReq(name, "k"))
		}, "batch", "is nil"},
		{"a nil limiter", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, nil, nested, insertBatch(-1, &ran), commitReq(name, "k"))
		}, "limiter", "is nil"},
		{"Reserve", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, e.l, nested, insertBatch(-1, &ran), commitReq(name, "k", txlimit.Reserve()))
		}, "Reserve", "in a batch"},
		{"UpTo", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, e.l, nested, insertBatch(-1, &ran), commitReq(name, "k", txlimit.UpTo(2)))
		}, "UpTo", "in a batch"},
		{"no request", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, e.l, nested, insertBatch(-1, &ran))
		}, "reqs", "is empty"},
		{"a savepoint for tx", func() (txlimit.MultiResult, error) {
			return pgstore.SendBatch(ctx, e.l, nested, insertBatch(-1, &ran), commitReq(name, "k"))
		}, "", "pass the outer pgx.Tx"},
		{"a context already done", func() (txlimit.MultiResult, error) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			res, err := pgstore.SendBatch(cctx, e.l, tx, insertBatch(-1, &ran), commitReq(name, "k"))
			require.ErrorIs(t, err, context.Canceled)
			return res, err
		}, "", "the batch was not sent"},
	} {
		counter.Take()
		res, err := tc.call()
		require.ErrorContains(t, err, tc.want, tc.what)
		var inv *txlimit.InvalidError
		if tc.field != "" {
			require.ErrorAs(t, err, &inv, tc.what)
			require.Equal(t, tc.field, inv.Field, tc.what)
		} else {
			require.False(t, errors.As(err, &inv), tc.what)
		}
		require.NotErrorIs(t, err, txlimit.ErrRateLimited, tc.what)
		require.False(t, res.OK, tc.what)
		require.Zero(t, counter.Take(), "%s: nothing was sent", tc.what)
	}
	require.False(t, ran)

	var own int64
	require.NoError(t, e.order(&own)(nested))
	require.NoError(t, nested.Commit(ctx))
	require.NoError(t, tx.Commit(ctx))
	require.True(t, e.committed(t, own))
	require.False(t, e.committed(t, -1))
	require.Empty(t, e.h.Rows(t, name, "k"), "nothing taken")
	e.settled(t)
}

// TestBatchHotKeyExact: 32 callers on connections of their own, 4 calls
// each, on one lean key of capacity 50: exactly 50 grants, whose 50
// orders alone commit; every other call is a denial with a RetryAfter. Not
// parallel: its 33 connections, beside the other tests', would come close
// to the server's max_connections.
func TestBatchHotKeyExact(t *testing.T) {
	ctx := context.Background()
	const callers, calls, capacity = 32, 4, 50
	name := storetest.UniqueName(t, "hot")
	e := newCommitEnv(t, callers+1, nil, map[string]txlimit.Config{name: window(capacity)})
	e.hotKeyExact(t, name, callers, calls, capacity, func(id *int64) (txlimit.MultiResult, error) {
		return e.sendOrder(ctx, e.l, id, commitReq(name, "k"))
	})
}
