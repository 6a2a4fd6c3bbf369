package pgstore_test

// The take at commit (Commit, CommitTx) and in the caller's batch
// (SendBatch) through a real PgBouncer in transaction mode, in every pgx
// exec mode docs/scale-out.md lists as working there: the outcomes are the
// ones a direct connection gives (a grant commits, a denial is a
// *RateLimitedError with its RetryAfter and leaves nothing of the
// transaction, a failure of the caller's own statements is returned as it
// is). The business work is a row of orders, tagged with its cell.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// bouncerModes are the exec modes docs/scale-out.md lists as working
// through PgBouncer in transaction mode.
var bouncerModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// bouncerEnv is a database of its own, migrated, with a business table,
// behind a PgBouncer of its own in transaction mode with poolSize server
// connections; admin reads it directly.
type bouncerEnv struct {
	url   string // PgBouncer's
	admin *pgxpool.Pool
}

func newBouncerEnv(t *testing.T, poolSize int) *bouncerEnv {
	t.Helper()
	testdb.NeedPgBouncer(t)
	ctx := context.Background()
	db, direct := testdb.Database(t, "txlimit_pgbouncer")
	admin, err := pgxpool.New(ctx, direct)
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	require.NoError(t, migrations.Up(ctx, stdlib.OpenDBFromPool(admin), migrations.Postgres))
	_, err = admin.Exec(ctx, `CREATE TABLE orders (cell text, id bigint, PRIMARY KEY (cell, id))`)
	require.NoError(t, err)
	return &bouncerEnv{url: testdb.PgBouncer(t, db, "transaction", poolSize), admin: admin}
}

// pool is a pool through PgBouncer in exec mode mode.
func (e *bouncerEnv) pool(t *testing.T, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// orders is the ids of cell's committed orders.
func (e *bouncerEnv) orders(t *testing.T, cell string) []int64 {
	t.Helper()
	rows, err := e.admin.Query(context.Background(), `SELECT id FROM orders WHERE cell = $1`, cell)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// bouncerForm is one way to take a limit with the business work: it
// inserts order (cell, id) and takes req with it.
type bouncerForm struct {
	name string
	call func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], cell string, id int64, reqs ...txlimit.Request) (txlimit.MultiResult, error)
}

const insertOrder = `INSERT INTO orders (cell, id) VALUES ($1, $2)`

var bouncerForms = []bouncerForm{
	{"Commit", func(ctx context.Context, _ *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], cell string, id int64, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
		return l.Commit(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insertOrder, cell, id)
			return err
		}, reqs...)
	}},
	{"CommitTx", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], cell string, id int64, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return txlimit.MultiResult{}, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, insertOrder, cell, id); err != nil {
			return txlimit.MultiResult{}, err
		}
		return l.CommitTx(ctx, tx, reqs...)
	}},
	{"SendBatch", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], cell string, id int64, reqs ...txlimit.Request) (txlimit.MultiResult, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return txlimit.MultiResult{}, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		b := &pgx.Batch{}
		ran := false
		b.Queue(insertOrder, cell, id).Exec(func(pgconn.CommandTag) error {
			ran = true
			return nil
		})
		res, err := pgstore.SendBatch(ctx, l, tx, b, reqs...)
		if err != nil {
			return res, err
		}
		if !ran {
			return res, errors.New("the batch's callback did not run")
		}
		return res, tx.Commit(ctx)
	}},
}

// bouncerShapes are the limits of the matrix: capacity 100, refilling
// 100 an hour (RetryAfter 36 s once empty, the clock frozen).
var bouncerShapes = []struct {
	name   string
	config txlimit.Config
}{
	{"unsharded", txlimit.Config{Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour}},
	{"shards8", txlimit.Config{Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour, Shards: 8}},
	{"lease16", txlimit.Config{Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour, Lease: 16}},
}

// TestCommitThroughPgBouncer runs the take at commit and in the caller's
// batch through one PgBouncer in transaction mode with 24 server
// connections, in each exec mode that works there (each on a pool of its
// own): exactCommitThroughPgBouncer, callerErrorThroughPgBouncer and
// twoLimitsThroughPgBouncer, at once, sharing the server connections.
func TestCommitThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := newBouncerEnv(t, 24)
	t.Run("exact", func(t *testing.T) {
		t.Parallel()
		exactCommitThroughPgBouncer(t, e)
	})
	t.Run("caller error", func(t *testing.T) {
		t.Parallel()
		callerErrorThroughPgBouncer(t, e)
	})
	t.Run("two limits", func(t *testing.T) {
		t.Parallel()
		twoLimitsThroughPgBouncer(t, e)
	})
}

// twoLimitsThroughPgBouncer: in each exec mode, a call of each form on two
// limits, one of which denies, is a *RateLimitedError with that limit's
// RetryAfter (a denial reads both limits, in one batch), and nothing of
// its transaction remains; then one grant of each form.
func twoLimitsThroughPgBouncer(t *testing.T, e *bouncerEnv) {
	ctx := context.Background()
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	opts := &txlimit.Options{Clock: func() time.Time { return frozen }}
	for _, mode := range bouncerModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := e.pool(t, mode, 4)
			wide, narrow := storetest.UniqueName(t, "wide"), storetest.UniqueName(t, "narrow")
			limits := map[string]txlimit.Config{
				wide:   {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour},
				narrow: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour}, // one token in 20 minutes
			}
			l, err := txlimit.New(pgstore.New(pool), limits, opts)
			require.NoError(t, err)
			reader, err := txlimit.New(pgstore.New(e.admin), limits, opts)
			require.NoError(t, err)
			cell := t.Name()
			id := int64(0)
			for _, want := range []bool{true, false} {
				for _, form := range bouncerForms {
					id++
					res, err := form.call(ctx, pool, l, cell, id, commitReq(wide, "k"), commitReq(narrow, "k"))
					if want {
						require.NoError(t, err, form.name)
						require.True(t, res.OK, form.name)
						continue
					}
					var rl *txlimit.RateLimitedError
					require.ErrorAs(t, err, &rl, form.name)
					require.Equal(t, narrow, rl.Name, form.name)
					require.Equal(t, 20*time.Minute, rl.RetryAfter, form.name)
					require.False(t, res.OK, form.name)
					require.Len(t, res.Results, 2, form.name)
					require.True(t, res.Results[0].OK, "%s: the wide limit would grant", form.name)
					require.False(t, res.Results[1].OK, form.name)
				}
			}
			for name, left := range map[string]float64{wide: 97, narrow: 0} {
				snap, err := reader.Check(ctx, name, "k", txlimit.Count(0))
				require.NoError(t, err)
				require.Equal(t, left, snap.Remaining, name)
			}
			require.Len(t, e.orders(t, cell), len(bouncerForms), "the grants' orders alone")
		})
	}
}

// exactCommitThroughPgBouncer: for each exec mode, each limit shape
// (unsharded, Shards 8, Lease 16: Commit takes from leases, CommitTx and
// SendBatch from the row) and each form (Commit, CommitTx, SendBatch),
// 32 callers × 4 calls on one hot key of capacity 100, the clock frozen:
// exactly 100 grants, whose 100 orders alone commit, the limit then empty
// (tokens consumed = 100); every other call (28) a *RateLimitedError with
// RetryAfter 36 s, and no other error. The exec modes run at once, and
// the cells of a mode one after another.
func exactCommitThroughPgBouncer(t *testing.T, e *bouncerEnv) {
	const callers, calls, capacity = 32, 4, 100
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	opts := &txlimit.Options{Clock: func() time.Time { return frozen }}
	for _, mode := range bouncerModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := e.pool(t, mode, callers)
			for _, shape := range bouncerShapes {
				for _, form := range bouncerForms {
					t.Run(shape.name+"/"+form.name, func(t *testing.T) {
						cell := t.Name()
						name := storetest.UniqueName(t, "hot")
						limits := map[string]txlimit.Config{name: shape.config}
						l, err := txlimit.New(pgstore.New(pool), limits, opts)
						require.NoError(t, err)
						reader, err := txlimit.New(pgstore.New(e.admin), limits, opts)
						require.NoError(t, err)
						e.exact(t, cell, callers, calls, capacity, 36*time.Second, func(ctx context.Context, id int64) (txlimit.MultiResult, error) {
							return form.call(ctx, pool, l, cell, id, commitReq(name, "k"))
						})
						require.NoError(t, l.ReturnLeases(context.Background()))
						snap, err := reader.Check(context.Background(), name, "k", txlimit.Count(0))
						require.NoError(t, err)
						require.Zero(t, snap.Remaining, "tokens consumed = capacity")
					})
				}
			}
		})
	}
}

// exact runs callers goroutines of calls calls each, call committing order
// (cell, id) when it grants: capacity grants, whose orders alone commit,
// and every other call a denial (OK false, and a *RateLimitedError, both
// with RetryAfter retryAfter); any other outcome fails the test.
func (e *bouncerEnv) exact(t *testing.T, cell string, callers, calls, capacity int, retryAfter time.Duration, call func(ctx context.Context, id int64) (txlimit.MultiResult, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	granted := map[int64]bool{}
	denied := 0
	var others []string
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range calls {
				id := int64(c*calls + i)
				res, err := call(ctx, id)
				var rl *txlimit.RateLimitedError
				mu.Lock()
				switch {
				case err == nil && res.OK:
					granted[id] = true
				case errors.As(err, &rl) && rl.RetryAfter == retryAfter && res.RetryAfter == retryAfter && !res.OK:
					denied++

				default:
					others = append(others, fmt.Sprintf("OK %v RetryAfter %v: %v", res.OK, res.RetryAfter, err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(others) > 0 {
		t.Errorf("%d of %d calls neither granted nor denied; the first: %s", len(others), callers*calls, others[0])
	}
	require.Len(t, granted, capacity, "grants")
	require.Equal(t, callers*calls-capacity, denied, "denials")
	ids := e.orders(t, cell)
	require.Len(t, ids, capacity, "the granted orders alone committed")
	for _, id := range ids {
		require.True(t, granted[id], "order %d committed without a grant", id)
	}
}

// callerErrorThroughPgBouncer: in each exec mode, a failure of the
// caller's own statements is returned as it is by each form (not a
// denial, not the store's error), takes nothing, and leaves the pool's
// connections fit for the next call: fn's statement (Commit), a
// deferred constraint that fails at the COMMIT that rides with the take
// (Commit, CommitTx), and a statement or callback of the caller's batch
// (SendBatch). The exec modes run at once.
func callerErrorThroughPgBouncer(t *testing.T, e *bouncerEnv) {
	ctx := context.Background()
	_, err := e.admin.Exec(ctx, `CREATE TABLE deferred (id bigint PRIMARY KEY DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO deferred VALUES (1); INSERT INTO orders (cell, id) VALUES ('taken', 1)`)
	require.NoError(t, err)
	const capacity = 100
	boom := errors.New("the callback refuses")
	code := func(want string) func(t *testing.T, err error) {
		return func(t *testing.T, err error) {
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, want, pgErr.Code, "%v", err)
			require.NotErrorIs(t, err, txlimit.ErrNotMigrated)
		}
	}
	// Each case takes one token of (name, "k") with work that fails.
	cases := []struct {
		what  string
		call  func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error
		check func(t *testing.T, err error)
	}{
		{"Commit, fn's statement", func(ctx context.Context, _ *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			_, err := l.Commit(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertOrder, "taken", 1)
				return err
			}, req)
			return err
		}, code("23505")},
		{"Commit, a deferred constraint at COMMIT", func(ctx context.Context, _ *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			_, err := l.Commit(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO deferred VALUES ($1)`, 1)
				return err
			}, req)
			return err
		}, code("23505")},
		{"CommitTx, a deferred constraint at COMMIT", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `INSERT INTO deferred VALUES ($1)`, 1); err != nil {
				return err
			}
			_, err = l.CommitTx(ctx, tx, req)
			return err
		}, code("23505")},
		{"SendBatch, a duplicate key", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			return sendThenRollback(ctx, pool, l, req, func(b *pgx.Batch) { b.Queue(insertOrder, "taken", 1) })
		}, code("23505")},
		{"SendBatch, a table of the caller's that is missing", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			return sendThenRollback(ctx, pool, l, req, func(b *pgx.Batch) { b.Queue(`INSERT INTO no_orders (id) VALUES ($1)`, 1) })
		}, code("42P01")},
		{"SendBatch, a callback's error", func(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request) error {
			return sendThenRollback(ctx, pool, l, req, func(b *pgx.Batch) {
				b.Queue(insertOrder, "callback", 1).Exec(func(pgconn.CommandTag) error { return boom })
			})
		}, func(t *testing.T, err error) { require.ErrorIs(t, err, boom) }},
	}
	for _, mode := range bouncerModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := e.pool(t, mode, 2)
			name := storetest.UniqueName(t, "caller")
			limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour}}
			frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			opts := &txlimit.Options{Clock: func() time.Time { return frozen }}
			l, err := txlimit.New(pgstore.New(pool), limits, opts)
			require.NoError(t, err)
			reader, err := txlimit.New(pgstore.New(e.admin), limits, opts)
			require.NoError(t, err)
			value := func() float64 {
				snap, err := reader.Check(ctx, name, "k", txlimit.Count(0))
				require.NoError(t, err)
				return snap.Remaining
			}
			// A grant first, so that each case finds the key's row.
			_, err = l.Commit(ctx, func(pgx.Tx) error { return nil }, commitReq(name, "k"))
			require.NoError(t, err)
			for _, tc := range cases {
				for range 3 { // on each connection of the pool, and again
					err := tc.call(ctx, pool, l, commitReq(name, "k"))
					tc.check(t, err)
					require.NotErrorIs(t, err, txlimit.ErrRateLimited, tc.what)
					require.Equal(t, capacity-1.0, value(), "%s: nothing taken", tc.what)
				}
			}
			// The connections are fit: every form grants.
			for i, form := range bouncerForms {
				cell := t.Name()
				res, err := form.call(ctx, pool, l, cell, int64(i), commitReq(name, "k"))
				require.NoError(t, err, form.name)
				require.True(t, res.OK, form.name)
			}
			require.Equal(t, capacity-4.0, value())
			require.Len(t, e.orders(t, t.Name()), len(bouncerForms))
			require.Empty(t, e.orders(t, "callback"))
		})
	}
	t.Cleanup(func() { require.Len(t, e.orders(t, "taken"), 1) })
}

// sendThenRollback sends a batch queued by queue with the take of req in a
// transaction of pool's, and rolls the transaction back: the error is
// SendBatch's.
func sendThenRollback(ctx context.Context, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], req txlimit.Request, queue func(*pgx.Batch)) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	queue(b)
	_, err = pgstore.SendBatch(ctx, l, tx, b, req)
	return err
}
