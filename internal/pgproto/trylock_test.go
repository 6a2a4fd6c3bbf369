package pgproto

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgdb"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// TryLockShard takes the first row no other transaction holds going up from
// start, then on from shard 0, and never waits; WaitShard waits for one row.
// Checked with another transaction holding rows.
func TestTryLockShard(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 8)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l := driver.Limit{Name: "trylock", Key: "k", Shards: 4,
		Config: algo.Config{Kind: algo.TokenBucket, Rate: 4, Period: 1e6, Capacity: 4}}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return insertShards(ctx, tx, l) }))

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM txlimit WHERE name = $1 AND key = 'k' AND shard IN (1, 2) FOR UPDATE`, l.Name)
	require.NoError(t, err)

	try := func(start int32, readAll bool) (tried, pgx.Tx) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		got, err := tryLockShard(ctx, tx, driver.TakeParams{Limit: l, Now: &now, ReadAll: readAll}, start)
		require.NoError(t, err)
		return got, tx
	}
	for _, tc := range []struct {
		start int32
		want  int32
	}{{0, 0}, {1, 3}, {2, 3}, {3, 3}} {
		for _, readAll := range []bool{false, true} {
			got, tx := try(tc.start, readAll)
			require.True(t, got.locked, "start %d", tc.start)
			require.Equal(t, tc.want, got.row.Shard, "start %d: the first free row from there", tc.start)
			require.True(t, got.now.Equal(now))
			require.Equal(t, int32(3), got.top, "the highest shard the key has")
			if readAll {
				require.Len(t, got.all, 4, "every row is read, held or not")
			}
			require.NoError(t, tx.Rollback(ctx))
		}
	}

	// With 0 and 3 taken too, starting past them wraps around to nothing.
	other, tx := try(3, false)
	require.Equal(t, int32(3), other.row.Shard)
	zero, tx0 := try(0, false)
	require.Equal(t, int32(0), zero.row.Shard)
	for _, readAll := range []bool{false, true} {
		got, tx := try(2, readAll)
		require.False(t, got.locked, "every row is held")
		require.Equal(t, int32(3), got.top, "every shard may exist")
		require.NoError(t, tx.Rollback(ctx))
	}

	// waitShard queues for the row; the holder's rollback lets it through.
	waiter, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer waiter.Rollback(ctx)
	done := make(chan tried, 1)
	go func() {
		got, err := waitShard(ctx, waiter, driver.TakeParams{Limit: l, Now: &now}, 3)
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	select {
	case <-done:
		t.Fatal("waitShard returned while another transaction held the row")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, tx.Rollback(ctx))
	got := <-done
	require.True(t, got.locked)
	require.Equal(t, int32(3), got.row.Shard)
	require.NoError(t, tx0.Rollback(ctx))
	require.NoError(t, holder.Rollback(ctx))
}

// Every statement a batch sends is bound by a generated method: the queuer
// queues exactly what the method would have sent, and queued reports a
// method that did not reach it.
func TestQueuer(t *testing.T) {
	ctx := context.Background()
	b := &pgx.Batch{}
	require.NoError(t, queued(queries.WriteShard(ctx, queuer{b}, pgdb.WriteShardParams{Name: "n", Key: "k", Shard: 2, Value: 1.5, Ts: time.UnixMicro(7)})))
	require.Len(t, b.QueuedQueries, 1)
	require.Equal(t, []any{1.5, 0.0, time.UnixMicro(7), (*time.Time)(nil), "n", "k", int32(2)}, b.QueuedQueries[0].Arguments,
		"the generated argument order: value, prev, ts, paused_until, name, key, shard")
	require.Error(t, queued(nil), "a nil error means the statement was sent, not queued")
}
