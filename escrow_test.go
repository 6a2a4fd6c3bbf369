package txlimit_test

// Escrow mode (docs/escrow.md) is pgstore's: its tests are beside it. Here,
// what the Limiter refuses on stores and configurations where it cannot
// work.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

func TestEscrowRejectedWhereItCannotWork(t *testing.T) {
	t.Parallel()
	cfg := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, Escrow: true}

	_, err := txlimit.New(sqlitestore.New(testdb.OpenSQLite(t)), map[string]txlimit.Config{"e": cfg}, nil)
	var inv *txlimit.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "Escrow", inv.Field)
	require.Contains(t, err.Error(), "pgstore")

	_, err = txlimit.New(pgstore.New(nil), map[string]txlimit.Config{"e": cfg}, nil)
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "Escrow", inv.Field)
	require.Contains(t, err.Error(), "pool")

	sharded := cfg
	sharded.Shards = 4
	_, err = txlimit.New(pgstore.New(nil), map[string]txlimit.Config{"e": sharded}, nil)
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "Shards", inv.Field)

	// Inline configs are checked the same way, before anything is done.
	sl, err := txlimit.New(sqlitestore.New(testdb.OpenSQLite(t)), nil, nil)
	require.NoError(t, err)
	_, err = sl.Limit(context.Background(), "e", "k", txlimit.Inline(cfg))
	require.ErrorIs(t, err, txlimit.ErrInvalid)
	_, err = sl.Settle(context.Background(), 0)
	require.ErrorIs(t, err, txlimit.ErrInvalid)
}
