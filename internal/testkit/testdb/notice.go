package testdb

import (
	"os"
	"testing"
)

// Marker begins the line a test binary logs, once, about a server its
// tests use ("txlimit-test: PostgreSQL …"). go test shows a passing
// package's logs only with -v or -json; internal/testkit/testsummary reads
// go test -json and lists these lines, and every skip's reason, per
// package (README.md, Tests).
const Marker = "txlimit-test:"

// SkipOrFail fails tb under CI=true, where every server the tests need must
// answer, and skips it otherwise with msg, which says what is missing and
// how to provide it. Stores whose servers testdb does not find itself
// (MySQL, internal/testkit/mysqltest) call it when theirs is missing.
func SkipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("required under CI=true: %s", msg)
		return
	}
	tb.Skip(msg)
}

// Skip skips tb with msg, under CI too: for tests that run where what they
// need comes up in their budget (a Galera cluster) and say so when it does
// not.
func Skip(tb testing.TB, msg string) {
	tb.Helper()
	tb.Skip(msg)
}
