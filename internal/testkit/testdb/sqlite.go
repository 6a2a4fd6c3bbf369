package testdb

import (
	"os"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"path/filepath"
	"testing"
	"time"
)

// SQLitePath returns the path of a database file in a new directory, which
// is removed when tb ends, after the cleanups registered later (closing the
// database). Unlike t.TempDir's, the removal retries for a while: SQLite may
// still create or delete its -wal, -shm or -journal file as the last
// connection closes, and t.TempDir fails the test on a directory that is not
// empty yet ("directory not empty", seen once in CI).
func SQLitePath(tb testing.TB) string {
	tb.Helper()
	if path := os.Getenv(storetest.ChildDatabase); path != "" {
		return path // a process of the concurrency topic's own
	}
	dir, err := os.MkdirTemp("", "txlimit-sqlite-")
	if err != nil {
		tb.Fatalf("temp dir: %v", err)
	}
	tb.Cleanup(func() {
		for range 100 {
			if err = os.RemoveAll(dir); err == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		tb.Errorf("remove %s: %v", dir, err)
	})
	return filepath.Join(dir, "txlimit.db")
}
