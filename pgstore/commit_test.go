package pgstore_test

// Commit mode on a real PostgreSQL (Limiter.CommitTx and Commit): what
// the pipeline of lean takes and COMMIT costs on the wire, what a denial, a
// lost connection, a cancelled context and a nested transaction leave
// behind, and exact admission on a hot key. The transaction's own work is a
// row of a business table (orders) in the test's schema: it exists if and
// only if the transaction committed.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/pgxtest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// commitEnv is a schema with a business table, a pool of the test's own
// (application_name app, each dialed connection passed through wrap) and a
// second pool (admin) that reads what committed.
type commitEnv struct {
	pool   *pgxpool.Pool
	admin  *pgxpool.Pool
	app    string
	l      *txlimit.Limiter[pgx.Tx] // on pool
	reader *txlimit.Limiter[pgx.Tx] // on admin
	h      storetest.Harness[pgx.Tx]
	ids    atomic.Int64
}

func newCommitEnv(t *testing.T, maxConns int32, wrap func(net.Conn) net.Conn, limits map[string]txlimit.Config) *commitEnv {
	t.Helper()
	return newCommitEnvMode(t, maxConns, wrap, limits, pgx.QueryExecModeCacheStatement)
}

// newCommitEnvMode is newCommitEnv with pool in exec mode mode.
func newCommitEnvMode(t *testing.T, maxConns int32, wrap func(net.Conn) net.Conn, limits map[string]txlimit.Config, mode pgx.QueryExecMode) *commitEnv {
	t.Helper()
	ctx := context.Background()
	schema := testdb.Schema(t)
	admin := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	_, err := admin.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY)`)
	require.NoError(t, err)

	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	app := "txlimit_commit_" + schema[len("txlimit_test_"):]
	cc := cfg.ConnConfig
	cc.RuntimeParams["search_path"] = schema
	cc.RuntimeParams["application_name"] = app
	cc.DefaultQueryExecMode = mode
	if wrap != nil {
		// The wrappers parse the protocol's messages: no TLS.
		cc.TLSConfig = nil
		cc.Fallbacks = nil
		dial := cc.DialFunc
		cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return wrap(conn), nil
		}
	}
	cfg.MaxConns = maxConns
	// No liveness ping on acquire (pgxpool pings a connection idle for a
	// second): it would be a round trip of its own in the counts.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	l, err := txlimit.New(pgstore.New(pool), limits, nil)
	require.NoError(t, err)
	reader, err := txlimit.New(pgstore.New(admin), limits, nil)
	require.NoError(t, err)
	return &commitEnv{pool: pool, admin: admin, app: app, l: l, reader: reader, h: pgxtest.Harness(admin, pgstore.New(admin))}
}

// order is a transaction's work: it inserts a row of its own into orders,
// whose id it stores in *id.
func (e *commitEnv) order(id *int64) func(tx pgx.Tx) error {
	return func(tx pgx.Tx) error {
		*id = e.ids.Add(1)
		_, err := tx.Exec(context.Background(), `INSERT INTO orders (id) VALUES ($1)`, *id)
		return err
	}
}

// committed reports whether order id committed, read from the admin pool.
func (e *commitEnv) committed(t *testing.T, id int64) bool {
	t.Helper()
	var n int
	require.NoError(t, e.admin.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE id = $1`, id).Scan(&n))
	return n == 1
}

func (e *commitEnv) orders(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.admin.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	return n
}

// value is the committed value of (name, key), read from the admin pool.
func (e *commitEnv) value(t *testing.T, name, key string) float64 {
	t.Helper()
	snap, err := e.reader.Check(context.Background(), name, key, txlimit.Count(0))
	require.NoError(t, err)
	return snap.Remaining
}

// gone waits until backend pid has exited: its transaction has then
// committed or rolled back for good.
func (e *commitEnv) gone(t *testing.T, pid uint32) {
	t.Helper()
	for range 500 {
		var n int
		require.NoError(t, e.admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("backend %d still there", pid)
}

// settled asserts that the pool has no connection acquired and that no
// backend of the pool sits in a transaction.
func (e *commitEnv) settled(t *testing.T) {
	t.Helper()
	for i := 0; i < 500 && e.pool.Stat().AcquiredConns() > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, e.pool.Stat().AcquiredConns(), "connections still acquired")
	var inTx int
	for range 500 {
		require.NoError(t, e.admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`,
			e.app).Scan(&inTx))
		if inTx == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, inTx, "a backend of the pool is still in a transaction")
}

// roundTrips asserts that call, a transaction on e's one connection
// (MaxConns 1, dialed through counter) that commits order *id, costs want
// round trips, three times after a first call that prepares the statements
// it has not cached yet.
func (e *commitEnv) roundTrips(t *testing.T, counter *testdb.ReadyCounter, what string, want int, id *int64, call func() error) {
	t.Helper()
	require.NoError(t, call(), what)
	for i := range 3 {
		counter.Take()
		require.NoError(t, call(), what)
		require.Equal(t, want, counter.Take(), "%s: round trips of call %d", what, i)
		require.True(t, e.committed(t, *id), "%s: the work committed", what)
		require.Zero(t, e.pool.Stat().AcquiredConns(), "%s: the connection is back", what)
	}
}

func commitReq(name, key string, opts ...txlimit.Option) txlimit.Request {
	return txlimit.Request{Name: name, Key: key, Options: opts}
}

// window is a fixed window of rate per hour whose current window began a
// minute ago: it does not roll over while the test runs.
func window(rate float64) txlimit.Config {
	return txlimit.Config{Kind: txlimit.FixedWindow, Rate: rate, Period: time.Hour,
		Start: time.Now().Add(-time.Minute).Truncate(time.Second)}
}

// TestCommitRoundTrips pins the wire cost of commit mode with lean limits:
// Commit's transaction costs what the same transaction without a limit
// costs (BEGIN, the work, and the pipeline in place of COMMIT), and
// CommitTx one round trip more (pgx's ROLLBACK of a transaction the server
// already committed).
func TestCommitRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	counter := &testdb.ReadyCounter{}
	a, b := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b")
	e := newCommitEnv(t, 1, counter.Conn, map[string]txlimit.Config{
		a: window(1e6),
		b: {Kind: txlimit.TokenBucket, Rate: 1e6, Period: 1e4 * time.Hour}, // refills 0.03 a second
	})
	var id int64
	measure := func(what string, want int, call func() error) {
		t.Helper()
		e.roundTrips(t, counter, what, want, &id, call)
	}
	measure("pgx.BeginFunc, no limit", 3, func() error { return pgx.BeginFunc(ctx, e.pool, e.order(&id)) })
	measure("Commit, one limit", 3, func() error {
		_, err := e.l.Commit(ctx, e.order(&id), commitReq(a, "k"))
		return err
	})
	measure("Commit, two limits", 3, func() error {
		_, err := e.l.Commit(ctx, e.order(&id), commitReq(a, "k2"), commitReq(b, "k"))
		return err
	})
	measure("CommitTx", 4, func() error {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := e.order(&id)(tx); err != nil {
			return err
		}
		_, err = e.l.CommitTx(ctx, tx, commitReq(a, "k3"))
		return err
	})
	require.Equal(t, int64(1), e.pool.Stat().NewConnsCount(), "one connection did it all")
	require.Equal(t, 1e6-4, e.value(t, a, "k"))
	require.Equal(t, 1e6-4, e.value(t, a, "k2"))
	require.Equal(t, 1e6-4, e.value(t, a, "k3"))
	require.InDelta(t, 1e6-4, e.value(t, b, "k"), 1, "a bucket refills a little")
}

// TestCommitDeniedRoundTrips pins the wire cost of a denial at commit and in
// the caller's batch, which reads the limits for the RetryAfter in a
// transaction of their own after the ROLLBACK (so that a transaction-mode
// pooler keeps them on one server connection): "ROLLBACK; BEGIN" is one
// simple query, and the reads carry the ROLLBACK that ends them. In
// QueryExecModeExec, Commit costs BEGIN, the work, the pipeline, the
// ROLLBACK, the reads (5); SendBatch one more, pgx's ROLLBACK. In
// QueryExecModeDescribeExec, the work, the pipeline and the reads cost two
// round trips each (pgx describes, then executes).
func TestCommitDeniedRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		mode              pgx.QueryExecMode
		commit, sendBatch int
	}{
		{pgx.QueryExecModeExec, 5, 6},
		{pgx.QueryExecModeDescribeExec, 8, 9},
	} {
		counter := &testdb.ReadyCounter{}
		a, b := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b")
		e := newCommitEnvMode(t, 1, counter.Conn, map[string]txlimit.Config{a: window(1), b: window(1)}, tc.mode)
		var id int64
		for _, reqs := range [][]txlimit.Request{{commitReq(a, "k")}, {commitReq(a, "k2"), commitReq(b, "k")}} {
			_, err := e.l.Commit(ctx, e.order(&id), reqs...)
			require.NoError(t, err)
			for range 2 {
				counter.Take()
				_, err := e.l.Commit(ctx, e.order(&id), reqs...)
				require.ErrorIs(t, err, txlimit.ErrRateLimited)
				require.Equal(t, tc.commit, counter.Take(), "%v, %d limits: Commit", tc.mode, len(reqs))

				tx, err := e.pool.Begin(ctx)
				require.NoError(t, err)
				require.NoError(t, e.order(&id)(tx))
				_, err = pgstore.SendBatch(ctx, e.l, tx, &pgx.Batch{}, reqs...)
				require.ErrorIs(t, err, txlimit.ErrRateLimited)
				require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
				require.Equal(t, tc.sendBatch, counter.Take(), "%v, %d limits: SendBatch", tc.mode, len(reqs))
			}
		}
		require.Equal(t, 2, e.orders(t), "the two grants' orders alone")
		e.settled(t)
	}
}

// TestCommitDeniedInItsOwnTransaction: a denial leaves nothing of the transaction,
// reports the RetryAfter, and gives the connection back to the pool as it
// is, ready for the next call.
func TestCommitDeniedInItsOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "deny")
	e := newCommitEnv(t, 1, nil, map[string]txlimit.Config{name: window(1)})
	var pid uint32
	work := func(id *int64) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			pid = tx.Conn().PgConn().PID()
			return e.order(id)(tx)
		}
	}

	var granted int64
	_, err := e.l.Commit(ctx, work(&granted), commitReq(name, "k"))
	require.NoError(t, err)
	first := pid

	var denied int64
	res, err := e.l.Commit(ctx, work(&denied), commitReq(name, "k"))
	var rl *txlimit.RateLimitedError
	require.ErrorAs(t, err, &rl)
	require.Equal(t, name, rl.Name)
	require.Positive(t, rl.RetryAfter)
	require.LessOrEqual(t, rl.RetryAfter, time.Hour)
	require.False(t, res.OK)
	require.Equal(t, rl.RetryAfter, res.RetryAfter)
	require.Len(t, res.Results, 1)
	require.False(t, res.Results[0].OK)
	require.Zero(t, res.Results[0].Taken)

	require.True(t, e.committed(t, granted))
	require.False(t, e.committed(t, denied), "a denial leaves nothing of the transaction")
	require.Zero(t, e.value(t, name, "k"))
	require.Len(t, e.h.Rows(t, name, "k"), 1)
	e.settled(t)

	// The connection went back as it was: the next call runs on it.
	var next int64
	_, err = e.l.Commit(ctx, work(&next), commitReq(name, "k2"))
	require.NoError(t, err)
	require.True(t, e.committed(t, next))
	require.Equal(t, first, pid, "the same connection (MaxConns 1)")
	require.Equal(t, int64(1), e.pool.Stat().NewConnsCount(), "no connection was replaced")
	e.settled(t)
}

// dropConn closes its connection right after the Write that sends the
// pipeline of the takes and COMMIT, once armed: the server gets every
// statement, the client never reads the answer.
//
// After the first call the statements are prepared, and the pipeline names
// them (Bind "stmtcache_…") instead of carrying the text "COMMIT"; on a
// fresh connection pgx first sends Parse/Describe/Sync with the texts and no
// Execute. So the pipeline is recognised as the first Write after arming
// that executes statements: whole frontend messages (pgx flushes whole
// messages), with one Execute per statement, ending in a Sync.
type dropConn struct {
	net.Conn
	armed    *atomic.Bool
	executes *atomic.Int64 // the Execute messages of the pipeline dropped last
}

func (c *dropConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && c.armed.Load() {
		if k := executeMessages(p); k > 0 && c.armed.CompareAndSwap(true, false) {
			c.executes.Store(int64(k))
			_ = c.Conn.Close()
		}
	}
	return n, err
}

// executeMessages is the number of Execute messages in p when p is whole
// frontend messages ending with a Sync, and 0 otherwise.
func executeMessages(p []byte) int {
	k := 0
	for len(p) >= 5 {
		typ, n := p[0], int(binary.BigEndian.Uint32(p[1:5]))
		if n < 4 || 1+n > len(p) {
			return 0
		}
		if typ == 'E' {
			k++
		}
		p = p[1+n:]
		if typ == 'S' && len(p) == 0 {
			return k
		}
	}
	return 0
}

// TestCommitConnectionDropped: a connection lost once the pipeline is sent
// leaves the outcome unknown (ErrCommitUnknown), and whatever the server
// did, the work and the tokens went together: an order row exists if and
// only if its token was spent.
func TestCommitConnectionDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capacity, iterations = 100, 20
	name := storetest.UniqueName(t, "drop")
	var armed atomic.Bool
	var executes atomic.Int64
	e := newCommitEnv(t, 1, func(c net.Conn) net.Conn {
		return &dropConn{Conn: c, armed: &armed, executes: &executes}
	}, map[string]txlimit.Config{name: window(capacity)})

	committed := 0
	for i := range iterations {
		before := e.value(t, name, "k")
		var id int64
		var pid uint32
		executes.Store(0)
		_, err := e.l.Commit(ctx, func(tx pgx.Tx) error {
			if err := e.order(&id)(tx); err != nil {
				return err
			}
			pid = tx.Conn().PgConn().PID()
			armed.Store(true)
			return nil
		}, commitReq(name, "k"))
		require.False(t, armed.Load(), "iteration %d: the pipeline was never sent", i)
		require.Equal(t, int64(2), executes.Load(), "iteration %d: the pipeline dropped is the take and COMMIT", i)
		require.ErrorIs(t, err, txlimit.ErrCommitUnknown, "iteration %d", i)
		require.False(t, pgstore.Retryable(err), "iteration %d: a COMMIT of unknown outcome is not run again", i)

		// The backend's exit settles the transaction one way or the other.
		e.gone(t, pid)
		spent := before - e.value(t, name, "k")
		row := e.committed(t, id)
		require.Contains(t, []float64{0, 1}, spent, "iteration %d", i)
		require.Equal(t, row, spent == 1, "iteration %d: the order committed iff its token was spent (spent %v)", i, spent)
		if row {
			committed++
		}
		e.settled(t)
	}
	t.Logf("%d of %d transactions whose connection dropped after the pipeline committed", committed, iterations)
	require.Equal(t, committed, e.orders(t))
	require.Equal(t, float64(capacity-committed), e.value(t, name, "k"), "no token counted twice, none lost")

	// The pool recovers: a call on a fresh connection commits.
	var id int64
	_, err := e.l.Commit(ctx, e.order(&id), commitReq(name, "k"))
	require.NoError(t, err)
	require.True(t, e.committed(t, id))
	require.Equal(t, float64(capacity-committed-1), e.value(t, name, "k"))
}

// TestCommitContextCancelledInFn: a context cancelled while fn runs stops
// the call before the pipeline is sent: an ordinary error (the outcome is
// known: nothing committed), no token taken, no connection left behind.
func TestCommitContextCancelledInFn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "cancel")
	e := newCommitEnv(t, 1, nil, map[string]txlimit.Config{name: window(5)})
	// Warm the connection, so that the statements are cached: the
	// cancelled call then has nothing to prepare either.
	var warm int64
	_, err := e.l.Commit(ctx, e.order(&warm), commitReq(name, "warm"))
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var id int64
	var pid uint32
	_, err = e.l.Commit(cctx, func(tx pgx.Tx) error {
		if err := e.order(&id)(tx); err != nil {
			return err
		}
		pid = tx.Conn().PgConn().PID()
		cancel()
		return nil
	}, commitReq(name, "k"))
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, txlimit.ErrCommitUnknown, "nothing was sent: the outcome is known")
	require.NotErrorIs(t, err, txlimit.ErrRateLimited)
	require.False(t, pgstore.Retryable(err), "the caller gave up")

	e.settled(t)
	// The connection was left in its transaction and is closed; its
	// backend's exit rolls the transaction back.
	e.gone(t, pid)
	require.False(t, e.committed(t, id))
	require.Empty(t, e.h.Rows(t, name, "k"), "no take reached the server")
	require.Equal(t, float64(5), e.value(t, name, "k"))

	_, err = e.l.Commit(ctx, e.order(&id), commitReq(name, "k"))
	require.NoError(t, err)
	require.True(t, e.committed(t, id))
	require.Equal(t, float64(4), e.value(t, name, "k"))
	e.settled(t)
}

// TestCommitNestedTxRefused: CommitTx on a pgx savepoint (tx.Begin) is
// refused before anything is sent, and the outer transaction goes on and
// commits its own work.
func TestCommitNestedTxRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.UniqueName(t, "nested")
	e := newCommitEnv(t, 2, nil, map[string]txlimit.Config{name: window(5)})

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var outer, inner, after int64
	require.NoError(t, e.order(&outer)(tx))
	nested, err := tx.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.order(&inner)(nested))

	_, err = e.l.CommitTx(ctx, nested, commitReq(name, "k"))
	require.ErrorContains(t, err, "pass the outer pgx.Tx")
	require.NotErrorIs(t, err, txlimit.ErrCommitUnknown)
	require.NotErrorIs(t, err, txlimit.ErrRateLimited)

	// Nothing was sent, nothing rolled back (pgstore.Commit returns before
	// its Rollback): the savepoint is still open, and the outer transaction
	// still works and commits. (CommitTx's doc says that after an error
	// other than an *InvalidError tx has been rolled back; this one is
	// neither.)
	require.NoError(t, e.order(&after)(nested))
	require.NoError(t, nested.Commit(ctx)) // RELEASE SAVEPOINT
	require.NoError(t, tx.Commit(ctx))
	for _, id := range []int64{outer, inner, after} {
		require.True(t, e.committed(t, id), "order %d", id)
	}
	require.Empty(t, e.h.Rows(t, name, "k"), "nothing taken")
	require.Equal(t, float64(5), e.value(t, name, "k"))
	e.settled(t)

	// The outer transaction is what CommitTx takes.
	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, e.order(&outer)(tx))
	_, err = e.l.CommitTx(ctx, tx, commitReq(name, "k"))
	require.NoError(t, err)
	require.True(t, e.committed(t, outer))
	require.Equal(t, float64(4), e.value(t, name, "k"))
	e.settled(t)
}

// TestCommitHotKeyExact: 16 callers × 20 Commit on one lean key of
// capacity 50: exactly 50 grants, whose 50 orders alone commit; every other
// call is a denial with a RetryAfter.
func TestCommitHotKeyExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const callers, calls, capacity = 16, 20, 50
	name := storetest.UniqueName(t, "hot")
	e := newCommitEnv(t, callers+1, nil, map[string]txlimit.Config{name: window(capacity)})
	e.hotKeyExact(t, name, callers, calls, capacity, func(id *int64) (txlimit.MultiResult, error) {
		return e.l.Commit(ctx, e.order(id), commitReq(name, "k"))
	})
}

// hotKeyExact runs callers goroutines that each make calls calls of call,
// a transaction that commits order *id when the key name of capacity
// grants: exactly capacity calls are granted, and their orders alone
// commit; every other call is a denial with a RetryAfter.
func (e *commitEnv) hotKeyExact(t *testing.T, name string, callers, calls, capacity int, call func(id *int64) (txlimit.MultiResult, error)) {
	t.Helper()
	var mu sync.Mutex
	grantedIDs := map[int64]bool{}
	var granted, denied atomic.Int64
	var others []error
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				var id int64
				res, err := call(&id)
				var rl *txlimit.RateLimitedError
				switch {
				case err == nil && res.OK:
					granted.Add(1)
					mu.Lock()
					grantedIDs[id] = true
					mu.Unlock()
				case errors.As(err, &rl) && rl.RetryAfter > 0 && !res.OK:
					denied.Add(1)
				default:
					mu.Lock()
					others = append(others, fmt.Errorf("OK %v RetryAfter %v: %w", res.OK, res.RetryAfter, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Empty(t, others)
	require.Equal(t, int64(capacity), granted.Load())
	require.Equal(t, int64(callers*calls-capacity), denied.Load())
	require.Equal(t, capacity, e.orders(t), "the granted orders alone committed")
	rows, err := e.admin.Query(context.Background(), `SELECT id FROM orders`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	for _, id := range ids {
		require.True(t, grantedIDs[id], "order %d committed without a grant", id)
	}
	require.Zero(t, e.value(t, name, "k"))
	e.settled(t)
}
