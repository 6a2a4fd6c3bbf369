package pgstore_test

// Prune on PostgreSQL beside live traffic: it passes over what other
// transactions hold. What Prune deletes and keeps on every store is the
// conformance suite's prune topic (internal/testkit/storetest).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/pgxtest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// lockTimeoutPool is a pool on schema whose every statement gives up after
// 100ms of waiting for a lock, with SQLSTATE 55P03: a Prune on it that
// waited for live traffic would fail.
func lockTimeoutPool(t *testing.T, schema string) *pgxpool.Pool {
	return testdb.PoolParams(t, schema, pgx.QueryExecModeCacheStatement, 2, map[string]string{"lock_timeout": "100ms"})
}

// Prune passes over the rows other transactions hold instead of waiting for
// them, and deletes none of a key whose rows it does not all hold.
func TestPrunePostgresNeverWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8)
	h := pgxtest.Harness(pool, pgstore.New(pool))
	one, sharded := storetest.UniqueName(t, "one"), storetest.UniqueName(t, "sharded")
	limits := map[string]txlimit.Config{
		one:     {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		sharded: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4},
	}
	clk := storetest.NewClock()
	live, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	pruner, err := txlimit.New(pgstore.New(lockTimeoutPool(t, schema)), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	for _, k := range []string{"busy", "idle"} {
		_, err := live.Limit(ctx, one, k)
		require.NoError(t, err)
		_, err = live.Limit(ctx, sharded, k, txlimit.Count(8))
		require.NoError(t, err)
	}
	clk.Advance(time.Hour) // everything is full again

	// Live traffic holds the row of one/busy, and one shard of
	// sharded/busy (a count one shard holds takes the fast path).
	tx := h.Begin(t)
	res, err := live.LimitTx(ctx, tx, one, "busy")
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = live.LimitTx(ctx, tx, sharded, "busy")
	require.NoError(t, err)
	require.True(t, res.OK)
	var held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM txlimit AS t WHERE name = $1 AND key = 'busy'
		AND NOT EXISTS (SELECT FROM txlimit AS u WHERE u.name = t.name AND u.key = t.key AND u.shard = t.shard FOR UPDATE SKIP LOCKED)`,
		sharded).Scan(&held))
	require.Equal(t, 1, held, "the fast path holds one shard")

	pruned, err := pruner.Prune(ctx, nil)
	require.NoError(t, err, "Prune must not wait for the held rows (a wait would hit lock_timeout)")
	require.Equal(t, 5, pruned.Deleted, "one/idle and the 4 shards of sharded/idle")
	require.Len(t, h.Rows(t, one, "busy"), 1)
	require.Len(t, h.Rows(t, sharded, "busy"), 4, "no shard of a key in use is deleted")
	require.Empty(t, h.Rows(t, one, "idle"))
	require.Empty(t, h.Rows(t, sharded, "idle"))

	h.Rollback(tx)
	pruned, err = pruner.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 5, pruned.Deleted)
}

// Prune running in a loop beside live traffic on the same hot keys neither
// blocks it nor changes what it admits.
func TestPruneBesideTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 12)
	h := pgxtest.Harness(pool, pgstore.New(pool))
	name := storetest.UniqueName(t, "hot")
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 20, Period: time.Hour, Shards: 4}}
	clk := storetest.NewClock()
	live, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	pruner, err := txlimit.New(pgstore.New(lockTimeoutPool(t, schema)), limits, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	// Many keys used once long ago: full again, prunable.
	for i := range 50 {
		_, err := live.Limit(ctx, name, fmt.Sprint("old", i))
		require.NoError(t, err)
	}
	clk.Advance(time.Hour)

	stop := make(chan struct{})
	var pruneErr error
	var deleted int
	var pruneWG sync.WaitGroup
	pruneWG.Add(1)
	go func() {
		defer pruneWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := pruner.Prune(ctx, &txlimit.PruneOptions{BatchSize: 7})
			if err != nil {
				pruneErr = err
				return
			}
			deleted += res.Deleted
		}
	}()
	const workers, callsEach = 10, 6
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*callsEach)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range callsEach {
				tx := h.Begin(t)
				res, err := live.LimitTx(ctx, tx, name, "hot")
				if err == nil {
					err = h.Commit(tx)
				} else {
					h.Rollback(tx)
				}
				if err != nil {
					errs <- err
				} else if res.OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	pruneWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(pruneErr, &pgErr) {
		t.Fatalf("Prune waited for a lock: %v", pruneErr)
	}
	require.NoError(t, pruneErr)
	require.EqualValues(t, 20, admitted.Load())
	require.Equal(t, 50*4, deleted, "the 4 shards of each old key, and never the hot one")
	require.Len(t, h.Rows(t, name, "hot"), 4)
}
