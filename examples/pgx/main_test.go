package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// want is the whole output of the example.
const want = `Limit "sendMessage": 2 messages per minute per user (token bucket), on PostgreSQL.
The limiter's clock stands at 2026-03-01 12:00:00 UTC.

alice sends 3 messages; each send is one pgx.BeginFunc that calls LimitTx, then inserts:
  message 1 sent
  message 2 sent
  message 3 refused: txlimit: limit "sendMessage" key "alice": rate limited, retry after 30s
    errors.Is(err, txlimit.ErrRateLimited) = true
    errors.As gives a *txlimit.RateLimitedError: Name "sendMessage", Key "alice", RetryAfter 30s

bob sends an empty message: LimitTx takes a token, then the insert fails:
  before: 2 tokens; inside the transaction, after LimitTx: 1 token
  the insert failed: SQLSTATE 23514, constraint body_not_empty
  after: 2 tokens; pgx.BeginFunc rolled back, so the token came back

The messages table holds 2 rows.
`

func TestRun(t *testing.T) {
	url := testdb.URL(t)
	ctx := context.Background()
	var out strings.Builder
	require.NoError(t, run(ctx, &out, url))
	require.Equal(t, want, out.String())
}

// TestRunDropsItsSchema checks that the example leaves nothing behind.
func TestRunDropsItsSchema(t *testing.T) {
	url := testdb.URL(t)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_example_dropcheck_" + hex.EncodeToString(b)
	var out strings.Builder
	require.NoError(t, runInSchema(ctx, &out, url, schema))
	require.Equal(t, want, out.String())

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists))
	require.False(t, exists, "schema %s should have been dropped", schema)
}
