package pgstore_test

// Fault injection against a real PostgreSQL: every failure returns an error
// the caller can classify, leaves the state exactly as committed, and leaks
// no connection and no lock.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/observertest"
	"github.com/txlimit/txlimit/internal/testkit/pgxtest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

type faultEnv struct {
	pool  *pgxpool.Pool
	admin *pgxpool.Pool
	l     *txlimit.Limiter[pgx.Tx]
	name  string
	h     storetest.Harness[pgx.Tx]
}

func newFaultEnv(t *testing.T, maxConns int32) faultEnv {
	t.Helper()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, maxConns)
	admin := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	name := storetest.UniqueName(t, "fault")
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, nil)
	require.NoError(t, err)
	return faultEnv{pool: pool, admin: admin, l: l, name: name, h: pgxtest.Harness(admin, pgstore.New(admin))}
}

// settled asserts that nothing is left behind: no connection of the pool
// acquired and no lock held on the txlimit table by anyone.
func (e faultEnv) settled(t *testing.T) {
	t.Helper()
	// pgxpool releases a connection that died with its context in the
	// background; wait for that event rather than for a fixed time.
	for i := 0; i < 500 && e.pool.Stat().AcquiredConns() > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, e.pool.Stat().AcquiredConns(), "connections still acquired")
	// A terminated backend lets its locks go as it exits, a moment after
	// pg_terminate_backend returns: wait for that too.
	var locks int
	for i := 0; i < 500; i++ {
		require.NoError(t, e.admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE relation = 'txlimit'::regclass AND pid <> pg_backend_pid()`).Scan(&locks))
		if locks == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Zero(t, locks, "locks still held on txlimit")
}

func (e faultEnv) spend(t *testing.T, n float64) {
	t.Helper()
	res, err := e.l.Limit(context.Background(), e.name, "k", txlimit.Count(n))
	require.NoError(t, err)
	require.True(t, res.OK)
}

// waitUntilBlocked polls pg_stat_activity until pid waits on a lock: an
// event, not a sleep, so the test does not depend on timing.
func (e faultEnv) waitUntilBlocked(t *testing.T, pid uint32) {
	t.Helper()
	for range 1000 {
		var waiting bool
		require.NoError(t, e.admin.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited for the lock", pid)
}

func TestFaultBackendKilledMidTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 4)
	e.spend(t, 1)
	before := e.h.Rows(t, e.name, "k")

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := e.l.LimitTx(ctx, tx, e.name, "k", txlimit.Count(5))
	require.NoError(t, err)
	require.True(t, res.OK)
	pid := tx.Conn().PgConn().PID()
	_, err = e.admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)

	// The next statement or the commit fails; either way nothing committed.
	_, err = e.l.LimitTx(ctx, tx, e.name, "k")
	if err == nil {
		err = tx.Commit(ctx)
	}
	require.Error(t, err)
	require.True(t, pgstore.Retryable(err), "a killed backend before commit is retryable: %v", err)
	_ = tx.Rollback(ctx)

	require.Equal(t, before, e.h.Rows(t, e.name, "k"))
	e.settled(t)
	e.spend(t, 9) // all 9 remaining tokens are still there
}

func TestFaultLockAndStatementTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 4)
	e.spend(t, 1)
	before := e.h.Rows(t, e.name, "k")

	holder, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.l.LimitTx(ctx, holder, e.name, "k")
	require.NoError(t, err)

	for _, tc := range []struct{ setting, code string }{
		{"lock_timeout", "55P03"},
		{"statement_timeout", "57014"},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			tx, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, fmt.Sprintf("SET LOCAL %s = '20ms'", tc.setting))
			require.NoError(t, err)
			_, err = e.l.LimitTx(ctx, tx, e.name, "k")
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, tc.code, pgErr.Code)
			require.True(t, pgstore.Retryable(err))
			require.NoError(t, tx.Rollback(ctx))
		})
	}
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, before, e.h.Rows(t, e.name, "k"))
	e.settled(t)
}

func TestFaultContextCancelledWhileWaitingForLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 4)
	e.spend(t, 1)

	holder, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.l.LimitTx(ctx, holder, e.name, "k", txlimit.Count(2))
	require.NoError(t, err)

	waiter, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.l.LimitTx(cctx, waiter, e.name, "k")
		done <- err
	}()
	e.waitUntilBlocked(t, waiter.Conn().PgConn().PID())
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, pgstore.Retryable(err), "the caller gave up")
	_ = waiter.Rollback(ctx)

	require.NoError(t, holder.Commit(ctx))
	e.settled(t)
	snap, err := e.l.Check(ctx, e.name, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 7, snap.Remaining, 0.01, "1 + 2 spent; the cancelled call spent nothing")
}

func TestFaultPoolExhausted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 2)
	var held []pgx.Tx
	for range 2 {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		held = append(held, tx)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := e.l.Limit(tctx, e.name, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, pgstore.Retryable(err))
	for _, tx := range held {
		require.NoError(t, tx.Rollback(ctx))
	}
	require.Empty(t, e.h.Rows(t, e.name, "k"))
	e.settled(t)
	e.spend(t, 10)
}

// What the application sees when PostgreSQL restarts between two calls: every
// connection of its pool is gone. The first call may fail with a retryable
// error; none is lost or invented.
func TestFaultAllConnectionsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 3)
	e.spend(t, 3)
	before := e.h.Rows(t, e.name, "k")

	var pids []uint32
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := e.pool.Acquire(ctx)
		require.NoError(t, err)
		pids = append(pids, c.Conn().PgConn().PID())
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	for _, pid := range pids {
		_, err := e.admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
	}

	spent := 0.0
	for attempt := 0; attempt < 5; attempt++ {
		res, err := e.l.Limit(ctx, e.name, "k", txlimit.Count(2))
		if err != nil {
			require.True(t, pgstore.Retryable(err) || errors.Is(err, pgx.ErrTxClosed), "unclassifiable: %v", err)
			require.Equal(t, before, e.h.Rows(t, e.name, "k"), "a failed call changed the state")
			continue
		}
		require.True(t, res.OK)
		spent = 2
		break
	}
	require.Equal(t, 2.0, spent, "the pool recovered within a few calls")
	e.settled(t)
	snap, err := e.l.Check(ctx, e.name, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 5, snap.Remaining, 0.01)
}

func TestRetryableClassification(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "55P03"}), true},
		{context.Canceled, false},
		{&txlimit.InvalidError{Field: "Count"}, false},
	} {
		require.Equal(t, tc.want, pgstore.Retryable(tc.err), "%v", tc.err)
	}
}

// LockWait covers the time a call waited for a row another transaction held:
// at least from when PostgreSQL showed it waiting until the holder committed.
func TestObserverLockWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newFaultEnv(t, 4)
	rec := &observertest.Recorder{}
	l, err := txlimit.New(pgstore.New(e.pool), map[string]txlimit.Config{
		e.name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, &txlimit.Options{Observer: rec.Observe})
	require.NoError(t, err)
	e.spend(t, 1)

	holder, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, holder, e.name, "k")
	require.NoError(t, err)
	rec.Take()

	waiter, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := l.LimitTx(ctx, waiter, e.name, "k")
		done <- err
	}()
	e.waitUntilBlocked(t, waiter.Conn().PgConn().PID())
	blockedAt := time.Now()
	time.Sleep(20 * time.Millisecond) // keep it waiting a little
	require.NoError(t, holder.Commit(ctx))
	heldFor := time.Since(blockedAt)
	require.NoError(t, <-done)
	require.NoError(t, waiter.Commit(ctx))

	events := rec.Take()
	require.Len(t, events, 1)
	require.Equal(t, "allowed", events[0].Outcome)
	require.GreaterOrEqual(t, events[0].LockWait, heldFor-time.Millisecond,
		"the lock statement began before the wait was seen and ended after the commit")
	require.GreaterOrEqual(t, events[0].Duration, events[0].LockWait)
}
