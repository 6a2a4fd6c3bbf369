package testdb

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// ParallelTests is how many tests marked t.Parallel run at once in a test
// binary whose TestMain is Main, when -parallel is not given. go test's
// default is GOMAXPROCS, 2 on a small machine; but these tests spend their
// time waiting on PostgreSQL (round trips, row locks, commits), not on the
// CPU, so more of them at once finish sooner. A fixed number, not one per
// core, also bounds the connections they open together on any machine:
// each parallel test uses at most about 20, and a conformance suite's store
// or exec mode 9, so the run stays under PostgreSQL's default
// max_connections of 100.
const ParallelTests = 6

// Main is the TestMain of a test package whose tests wait on PostgreSQL:
// it runs m with -parallel ParallelTests unless -parallel is given.
func Main(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(ParallelTests))
	}
	os.Exit(m.Run())
}
