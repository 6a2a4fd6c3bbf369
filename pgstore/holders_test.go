package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// TestSendBatchRefusesConcurrency: pgstore.SendBatch, whose work is queued
// before the takes, refuses a Concurrency limit with an *InvalidError that
// names LimitTx, sending nothing: the transaction is left as it was and
// the batch's statements have not run.
func TestSendBatchRefusesConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"exports": {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Minute},
		"api":     {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Second},
	}, nil)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ran := false
	b := insertBatch(1, &ran)
	_, err = pgstore.SendBatch(ctx, l, tx, b, txlimit.Request{Name: "api", Key: "k"}, txlimit.Request{Name: "exports", Key: "k"})
	var inv *txlimit.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "exports", inv.Limit)
	require.Contains(t, inv.Problem, "LimitTx")
	require.False(t, ran)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
	res, err := l.CheckTx(ctx, tx, "exports", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
}
