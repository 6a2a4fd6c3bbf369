package pgstore_test

// pgstore's behaviour beyond the conformance suite (internal/testkit/storetest):
// row locks held until commit, strict isolation levels, a missing or closed
// pool.

import (
	"context"
	"errors"
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

func TestPostgresLockIsHeldUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4)
	name := storetest.UniqueName(t, "held")
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, nil)
	require.NoError(t, err)

	tx1, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	res, err := l.LimitTx(ctx, tx1, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	// While tx1 is open, another transaction cannot take the row.
	tx2, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	_, err = tx2.Exec(ctx, "SET LOCAL lock_timeout = '50ms'")
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, tx2, name, "k")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available")
	require.NoError(t, tx2.Rollback(ctx))

	require.NoError(t, tx1.Commit(ctx))
	res, err = l.Limit(ctx, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	snap, err := l.Check(ctx, name, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 8, snap.Remaining, 0.5, "two spent, a little refilled")
}

// Under REPEATABLE READ and SERIALIZABLE a concurrent update of the same
// limit is a serialization failure, retryable; retrying admits exactly.
func TestPostgresStrictIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 20)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			name := storetest.UniqueName(t, "iso")
			clk := storetest.NewClock()
			l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: 20, Period: time.Hour},
			}, &txlimit.Options{Clock: clk.Now})
			require.NoError(t, err)
			var admitted, denied, retries atomic.Int64
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 2 {
						for {
							var res txlimit.Result
							err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) (err error) {
								res, err = l.LimitTx(ctx, tx, name, "k")
								return err
							})
							var pgErr *pgconn.PgError
							if errors.As(err, &pgErr) && pgErr.Code == "40001" {
								retries.Add(1)
								continue
							}
							if err != nil {
								t.Error(err)
								return
							}
							if res.OK {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
							break
						}
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 20, admitted.Load())
			require.EqualValues(t, 12, denied.Load())
			t.Logf("%s: %d serialization failures retried", iso, retries.Load())
		})
	}
}

func TestPostgresPoolErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	name := storetest.UniqueName(t, "pool")
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Minute}}

	// Without a pool only the Tx forms work.
	l, err := txlimit.New(pgstore.New(nil), limits, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, name, "k")
	storetest.RequireNoPool(t, err)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := l.LimitTx(ctx, tx, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, tx.Rollback(ctx))

	// A closed pool is an error, not a panic.
	closed := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	closed.Close()
	l, err = txlimit.New(pgstore.New(closed), limits, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, name, "k")
	require.Error(t, err)
	_, err = l.Check(ctx, name, "k", txlimit.Count(0))
	require.Error(t, err)
}

// LimitAll, the form with its own transaction, needs the pool.
func TestMultiOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4)
	a, b := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b")
	limits := map[string]txlimit.Config{
		a: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		b: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
	}
	l, err := txlimit.New(pgstore.New(pool), limits, nil)
	require.NoError(t, err)
	res, err := l.LimitAll(ctx, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"})
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = l.LimitAll(ctx, txlimit.Request{Name: a, Key: "k"}, txlimit.Request{Name: b, Key: "k"})
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Len(t, storetest.Denied(res), 1)
	require.Equal(t, b, storetest.Denied(res)[0].Name)
	snap, err := l.Check(ctx, a, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 1, snap.Remaining, 0.01, "the denied call took nothing from a")

	noPool, err := txlimit.New(pgstore.New(nil), limits, nil)
	require.NoError(t, err)
	_, err = noPool.LimitAll(ctx, txlimit.Request{Name: a, Key: "k"})
	storetest.RequireNoPool(t, err)
}

// pgx's default exec mode caches prepared statements per connection; behind
// PgBouncer in transaction mode the server connection changes under it and
// the statement is gone. DEALLOCATE ALL does to the connection what the
// pooler does: the error then names the exec modes that work.
func TestPostgresLostPreparedStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 1)
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"l": {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Second},
	}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k")
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k") // every statement of the path is prepared now
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k")
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "26000", pgErr.Code)
	require.Contains(t, err.Error(), "QueryExecModeExec")
}
