package testdb

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var noticeOnce sync.Once

// printNotice writes msg once per test binary where the user sees it.
//
// `go test ./...` (package list mode) buffers a test binary's stdout and
// stderr and, for a package that passes, prints only its "ok" line: a
// t.Skip message is seen with -v only. So the notice goes around that
// buffer: to the stderr of the go command that runs the binary (on Linux,
// /proc/<parent>/fd/2, when it is a terminal, a pipe, or a file opened for
// appending, as `2>>log` does; a file opened by `2>log` is left alone, since
// writing it through a second file description would overwrite the go
// command's own output), else to the controlling terminal (/dev/tty). With -v
// the skip is printed anyway and nothing more is written.
func printNotice(msg string) {
	if testing.Verbose() {
		return
	}
	noticeOnce.Do(func() {
		w := noticeWriter()
		if w == nil {
			return
		}
		defer w.Close()
		name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
		fmt.Fprintf(w, "%s: %s\n", name, strings.Join(strings.Fields(msg), " "))
	})
}

func noticeWriter() io.WriteCloser {
	ppid := os.Getppid()
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/comm")
	if err == nil && strings.TrimSpace(string(comm)) == "go" {
		fd := "/proc/" + strconv.Itoa(ppid) + "/fd/2"
		if fi, err := os.Stat(fd); err == nil && (fi.Mode()&(os.ModeCharDevice|os.ModeNamedPipe) != 0 || fi.Mode().IsRegular() && appending(ppid)) {
			if f, err := os.OpenFile(fd, os.O_WRONLY|os.O_APPEND, 0); err == nil {
				return f
			}
		}
	}
	if f, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		return f
	}
	return nil
}

// appending reports whether the go command's stderr was opened with O_APPEND.
func appending(ppid int) bool {
	info, err := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/fdinfo/2")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&uint64(os.O_APPEND) != 0
		}
	}
	return false
}

// SkipOrFail fails tb under CI=true, where every server the tests need must
// answer, and skips it otherwise, with msg written where `go test ./...`
// shows it (printNotice). Stores whose servers testdb does not find itself
// (MySQL, internal/testkit/mysqltest) call it when theirs is missing.
func SkipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("required under CI=true: %s", msg)
		return
	}
	printNotice(msg)
	tb.Skip(msg)
}

// Skip skips tb with msg written where `go test ./...` shows it, under CI
// too: for tests that run where what they need comes up in their budget
// (a Galera cluster) and say so when it does not.
func Skip(tb testing.TB, msg string) {
	tb.Helper()
	printNotice(msg)
	tb.Skip(msg)
}
