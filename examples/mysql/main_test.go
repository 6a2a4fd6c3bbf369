package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRun runs the example against a real server: TEST_MYSQL_DSN, else the
// local test server. Without one it skips, except under CI=true, where it
// fails.
func TestRun(t *testing.T) {
	dsn := cmp.Or(os.Getenv("TEST_MYSQL_DSN"), defaultDSN)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		if os.Getenv("CI") == "true" {
			t.Fatalf("MySQL or MariaDB is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING: no MySQL or MariaDB (set TEST_MYSQL_DSN or run scripts/mariadb.sh): %v", err)
	}
	_ = db.Close()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), dsn, &out))
	require.Equal(t, `message 1 from alice: sent (1 left)
message 2 from alice: sent (0 left)
message 3 from alice: denied, retry in 30s
message 1 from bob: sent (1 left)
message 2 from bob: sent (0 left)
message 3 from bob: denied, retry in 30s
4 messages stored
`, out.String())
}
