package pgstore_test

import (
	"testing"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// TestMain runs testdb.ParallelTests parallel tests at once, not go test's
// one per core: they wait on PostgreSQL, not on the CPU.
func TestMain(m *testing.M) { testdb.Main(m) }
