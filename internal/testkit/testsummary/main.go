// Command testsummary reads the events of go test -json on its stdin and
// prints, per package, what a passing package's output hides: the servers
// its tests used (the lines they log once, beginning with testdb.Marker)
// and every test it skipped, with the reason the skip gave, then the
// packages and tests that failed. It exits 1 when a package failed, so that
//
//	go test -json ./... | go run ./internal/testkit/testsummary
//
// is go test ./... with that summary (the go command's own errors, such as
// a package that does not build, go to its stderr as usual).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// pkg is what the summary says of one package.
type pkg struct {
	result  string   // ok, FAIL, or "" while it runs
	elapsed float64  // seconds
	servers []string // the Marker lines, without the marker
	skipped []string // "TestName: reason"
	failed  []string // test names
	noTests bool
}

func main() {
	failed, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// summarize reads go test -json from r and writes the summary to w. It
// reports whether a package failed.
func summarize(r io.Reader, w io.Writer) (failed bool, err error) {
	pkgs := map[string]*pkg{}
	var order []string
	output := map[[2]string][]string{} // the output lines of a running test
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return false, fmt.Errorf("not go test -json output: %v: %q", err, sc.Text())
		}
		if e.Package == "" {
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkg{}
			pkgs[e.Package] = p
			order = append(order, e.Package)
		}
		id := [2]string{e.Package, e.Test}
		switch e.Action {
		case "output":
			line := strings.TrimSpace(e.Output)
			if _, after, ok := strings.Cut(line, testdb.Marker); ok {
				p.servers = append(p.servers, strings.TrimSpace(after))
			}
			if e.Test != "" && !skipNoise(line) {
				output[id] = append(output[id], line)
			}
		case "skip":
			if e.Test == "" {
				p.result, p.noTests = "ok", true
				continue
			}
			p.skipped = append(p.skipped, e.Test+": "+reason(output[id]))
			delete(output, id)
		case "fail":
			if e.Test == "" {
				p.result, p.elapsed = "FAIL", e.Elapsed
				failed = true
				continue
			}
			p.failed = append(p.failed, e.Test)
			delete(output, id)
		case "pass":
			if e.Test == "" {
				p.result, p.elapsed = "ok", e.Elapsed
				continue
			}
			delete(output, id)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	slices.Sort(order)
	var skips int
	for _, name := range order {
		p := pkgs[name]
		if p.noTests {
			continue
		}
		result := p.result
		if result == "" {
			result, failed = "FAIL", true // the stream ended before the package did
		}
		fmt.Fprintf(w, "%-4s %s (%.1fs)\n", result, name, p.elapsed)
		for _, s := range slices.Compact(p.servers) {
			fmt.Fprintf(w, "       uses %s\n", s)
		}
		for _, s := range p.skipped {
			fmt.Fprintf(w, "       SKIP %s\n", s)
		}
		for _, t := range p.failed {
			fmt.Fprintf(w, "       FAIL %s\n", t)
		}
		skips += len(p.skipped)
	}
	fmt.Fprintf(w, "\n%d skipped test(s); ", skips)
	if failed {
		fmt.Fprintln(w, "FAIL: run go test -v on the failed packages for their output")
	} else {
		fmt.Fprintln(w, "every package passed")
	}
	return failed, nil
}

// skipNoise reports whether line is go test's own (a test's start, pause,
// or result) rather than what the test said.
func skipNoise(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- SKIP", "--- PASS", "--- FAIL"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return line == ""
}

// reason is the message of a skip: the test's last output line, without
// the file:line prefix the testing package puts before it.
func reason(lines []string) string {
	if len(lines) == 0 {
		return "(no reason given)"
	}
	last := lines[len(lines)-1]
	if i := strings.Index(last, ": "); i > 0 && strings.Contains(last[:i], ".go:") {
		last = last[i+2:]
	}
	return last
}
