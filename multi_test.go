package txlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/storetest"
	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

func names(rs []txlimit.Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
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
	res, err := l.LimitAll(ctx, txlimit.Req(a, "k"), txlimit.Req(b, "k"))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = l.LimitAll(ctx, txlimit.Req(a, "k"), txlimit.Req(b, "k"))
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, []string{b}, names(res.Denied()))
	snap, err := l.Value(ctx, a, "k")
	require.NoError(t, err)
	require.InDelta(t, 1, snap.Value, 0.01, "the denied call took nothing from a")

	noPool, err := txlimit.New(pgstore.New(nil), limits, nil)
	require.NoError(t, err)
	_, err = noPool.LimitAll(ctx, txlimit.Req(a, "k"))
	require.ErrorIs(t, err, txlimit.ErrNoPool)
}
