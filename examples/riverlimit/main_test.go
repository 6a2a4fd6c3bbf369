package main

// The test runs the example against a real PostgreSQL: TEST_DATABASE_URL,
// else the local test server, in a schema of its own that run drops.

import (
	"bytes"
	"cmp"
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestRun runs the example and holds its output to what the package
// comment promises: 2 exports at once per tenant at most, acme's 3 beyond 2
// snoozed for SlotWait plus jitter, no attempt spent, every slot free.
func TestRun(t *testing.T) {
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		err = conn.Ping(ctx)
		_ = conn.Close(ctx)
	}
	cancel()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING the riverlimit example's test: no PostgreSQL at %s: %v (set TEST_DATABASE_URL or start a local server)", url, err)
	}
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), url, &out))
	require.Equal(t, `7 exports enqueued: acme 5, globex 2; at most 2 run at once per tenant
acme: 5 exports done, at most 2 at once; 3 waited for a slot (snoozed, no attempt spent)
globex: 2 exports done, at most 2 at once; 0 waited for a slot (snoozed, no attempt spent)
snoozes: each for the 1s SlotWait plus jitter below 250ms
attempts: at most 1 per job
slots: released in the transactions that completed the jobs; 4 of 4 free at the end
`, out.String())
}
