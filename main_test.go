package txlimit_test

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// parallelTests is how many tests marked t.Parallel run at once when
// -parallel is not given. go test's default is GOMAXPROCS, 2 on a small
// machine; but these tests spend their time waiting on PostgreSQL (round
// trips, row locks, commits), not on the CPU, so more of them at once
// finish sooner. A fixed number, not one per core, also bounds the
// connections they open together on any machine: each parallel test uses at
// most 16 (the conformance suite's concurrency topic), so the run stays well
// under PostgreSQL's default max_connections of 100.
const parallelTests = 6

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(parallelTests))
	}
	os.Exit(m.Run())
}
