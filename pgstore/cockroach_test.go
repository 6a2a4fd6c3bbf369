package pgstore_test

// CockroachDB keeps the row locks a transaction took after a savepoint when
// it rolls back to that savepoint; PostgreSQL lets them go. The sharded fast
// path tries a shard inside a savepoint and rolls back to it when the shard
// lacks the tokens, then locks every shard. This test runs that path on
// PostgreSQL with the rollback to the savepoint left out (the savepoint is
// only released), so that a tried shard stays locked as on CockroachDB: the
// accounting must stay exact, and what it costs is waiting, deadlocks
// (retryable), and retries.

import (
	"context"
	"errors"
	"strings"
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

const rollbackToTry = "ROLLBACK TO SAVEPOINT txlimit_try"

// keepLocksTx is a pgx.Tx that leaves out every ROLLBACK TO SAVEPOINT
// txlimit_try the store sends: the RELEASE that follows it then keeps the
// row locks taken since the savepoint, as CockroachDB's rollback does. The
// fast path writes nothing between the savepoint and the rollback, so
// nothing else changes.
type keepLocksTx struct {
	pgx.Tx
	dropped *atomic.Int64
}

func (tx keepLocksTx) strip(sql string) (string, bool) {
	if !strings.Contains(sql, rollbackToTry) {
		return sql, false
	}
	tx.dropped.Add(1)
	s := strings.TrimPrefix(strings.TrimSpace(strings.Replace(sql, rollbackToTry, "", 1)), ";")
	return strings.TrimSpace(s), true
}

func (tx keepLocksTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s, ok := tx.strip(sql); ok && s == "" {
		return pgconn.CommandTag{}, nil
	} else if ok {
		sql = s
	}
	return tx.Tx.Exec(ctx, sql, args...)
}

func (tx keepLocksTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	out := &pgx.Batch{}
	for _, q := range b.QueuedQueries {
		if s, ok := tx.strip(q.SQL); ok {
			if s == "" {
				continue
			}
			q.SQL = s
		}
		out.Queue(q.SQL, q.Arguments...)
	}
	if out.Len() != b.Len() {
		// The store reads one result per statement it queued: give the
		// left-out rollback an empty one.
		return &paddedResults{BatchResults: tx.Tx.SendBatch(ctx, out), skip: b, kept: out}
	}
	return tx.Tx.SendBatch(ctx, out)
}

// paddedResults answers Exec for a left-out statement without reading the
// server's results.
type paddedResults struct {
	pgx.BatchResults
	skip, kept *pgx.Batch
	i          int
}

func (r *paddedResults) Exec() (pgconn.CommandTag, error) {
	q := r.skip.QueuedQueries[r.i]
	r.i++
	if strings.TrimSpace(q.SQL) == rollbackToTry {
		return pgconn.CommandTag{}, nil
	}
	return r.BatchResults.Exec()
}

func (r *paddedResults) Query() (pgx.Rows, error) {
	r.i++
	return r.BatchResults.Query()
}

func (r *paddedResults) QueryRow() pgx.Row {
	r.i++
	return r.BatchResults.QueryRow()
}

// TestShardedKeepsLocksAfterRollbackToSavepoint drains a sharded limit with
// 12 clients taking 3 tokens at a time, so that shards come to lack the
// tokens and the fast path rolls back to its savepoint, with that rollback
// keeping the shard locked. Exactly the tokens there are are granted.
func TestShardedKeepsLocksAfterRollbackToSavepoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 13)
	name := storetest.UniqueName(t, "kept")
	// 16 tokens a shard: after five takes each shard lacks the tokens.
	const capacity, count, clients = 64, 3, 12
	frozen := storetest.T0
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: 4},
	}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)

	var (
		dropped, granted, retried atomic.Int64
		wg                        sync.WaitGroup
		mu                        sync.Mutex
		failures                  []error
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var (
					ok    bool
					pgErr *pgconn.PgError
				)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					// Deadlocks are expected here; find them fast.
					if _, err := tx.Exec(ctx, "SET LOCAL deadlock_timeout = '20ms'"); err != nil {
						return err
					}
					res, err := l.LimitTx(ctx, keepLocksTx{Tx: tx, dropped: &dropped}, name, "k", txlimit.Count(count))
					ok = res.OK
					return err
				})
				switch {
				case err == nil && ok:
					granted.Add(1)
				case err == nil:
					return // denied: the limit is drained
				case pgstore.Retryable(err) && errors.As(err, &pgErr) && pgErr.Code == "40P01":
					retried.Add(1) // a deadlock: retry from BEGIN
				default:
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Empty(t, failures)
	v, err := l.Check(ctx, name, "k", txlimit.Count(0))
	require.NoError(t, err)
	t.Logf("%d grants, %d rollbacks to the savepoint left out, %d retried transactions (deadlocks)",
		granted.Load(), dropped.Load(), retried.Load())
	require.Positive(t, dropped.Load(), "the fast path rolled back to its savepoint: the case under test ran")
	require.Equal(t, int64(capacity/count), granted.Load(), "every grant that fits, and no more")
	require.InDelta(t, capacity%count, v.Remaining, 1e-9, "what is left is less than a count")

	// The emulation holds: a denied call tries a shard (which lacks the
	// tokens), rolls back to the savepoint and reads the rest without a
	// lock. On PostgreSQL it then holds no row; with the rollback left out,
	// as on CockroachDB, it holds the shard it tried until it ends.
	free := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM txlimit
			WHERE name = $1 AND key = 'k' FOR UPDATE SKIP LOCKED) AS f`, name).Scan(&n))
		return n
	}
	for _, keep := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		var in pgx.Tx = tx
		if keep {
			in = keepLocksTx{Tx: tx, dropped: &dropped}
		}
		res, err := l.LimitTx(ctx, in, name, "k", txlimit.Count(count))
		require.NoError(t, err)
		require.False(t, res.OK)
		if keep {
			require.Equal(t, 3, free(), "the tried shard stays locked")
		} else {
			require.Equal(t, 4, free(), "a denial holds no row")
		}
		require.NoError(t, tx.Rollback(ctx))
	}
}
