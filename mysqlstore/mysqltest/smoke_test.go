package mysqltest

import (
	"context"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/mysqlstore"
)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	db := Database(t, 4)
	store := mysqlstore.New(db)
	require.NoError(t, store.Ping(ctx))
	l, err := txlimit.New(store, map[string]txlimit.Config{
		"one": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
		"fw":  {Kind: txlimit.FixedWindow, Rate: 3, Period: time.Hour},
		"sh":  {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: 4},
	}, nil)
	require.NoError(t, err)
	for _, name := range []string{"one", "fw"} {
		for i := range 4 {
			res, err := l.Limit(ctx, name, "k")
			require.NoError(t, err)
			require.Equal(t, i < 3, res.OK, "%s call %d: %+v", name, i, res)
		}
	}
	for i := range 9 {
		res, err := l.Limit(ctx, "sh", "k")
		require.NoError(t, err)
		require.Equal(t, i < 8, res.OK, "sh call %d: %+v", i, res)
	}
	m, err := l.LimitAll(ctx, txlimit.Req("one", "m"), txlimit.Req("sh", "m", txlimit.Count(2)))
	require.NoError(t, err)
	require.True(t, m.OK)
	snap, err := l.Value(ctx, "sh", "m")
	require.NoError(t, err)
	require.InDelta(t, 6, snap.Value, 1e-3)
	require.NoError(t, l.Reset(ctx, "sh", "m"))
	require.NoError(t, l.Credit(ctx, "one", "k", 1))
	res, err := l.Limit(ctx, "one", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	_, err = l.Prune(ctx, nil)
	require.NoError(t, err)
}
