// Package measure reads what the performance tools and benchmarks count
// outside the Go runtime: the CPU time of processes, from /proc, and the
// instructions a process ran under valgrind's callgrind
// (scripts/callgrind.sh), from its output file.
package measure

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcessTicks is the CPU (user and system) process pid has used, in clock
// ticks (USER_HZ, 100 a second on Linux), with its command name.
func ProcessTicks(pid string) (comm string, ticks int64, err error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", 0, err
	}
	// The command name is in parentheses and may hold spaces; the fields
	// after it are space-separated, utime and stime the 12th and 13th.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("/proc/%s/stat: no command name in %q", pid, s)
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return "", 0, fmt.Errorf("/proc/%s/stat: %d fields after the command name, want at least 13", pid, len(f))
	}
	utime, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return "", 0, err
	}
	stime, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return "", 0, err
	}
	return s[open+1 : end], utime + stime, nil
}

// CommandTicks is the CPU of every live process named comm, summed, in
// clock ticks. A process that ends while it is read is left out.
func CommandTicks(comm string) int64 {
	var total int64
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		name, ticks, err := ProcessTicks(filepath.Base(filepath.Dir(path)))
		if err == nil && name == comm {
			total += ticks
		}
	}
	return total
}

// ClockTicks is the unit of ProcessTicks: USER_HZ, a second's ticks.
const ClockTicks = 100

// CallgrindTotal waits up to a minute for callgrind's file at path (valgrind
// writes it as the process ends) and returns the instructions it counted.
func CallgrindTotal(path string) (int64, error) {
	for range 600 {
		if b, err := os.ReadFile(path); err == nil {
			for line := range strings.SplitSeq(string(b), "\n") {
				if rest, ok := strings.CutPrefix(line, "totals: "); ok {
					return strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("%s: no callgrind totals after a minute (is the server running under scripts/callgrind.sh?)", path)
}
