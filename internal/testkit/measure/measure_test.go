package measure

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProcessTicks(t *testing.T) {
	// Burn some CPU, so that this process has used at least a tick.
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	comm, ticks, err := ProcessTicks("self")
	require.NoError(t, err)
	// The kernel keeps the first 15 bytes of the executable's name.
	exe := filepath.Base(os.Args[0])
	require.Equal(t, exe[:min(len(exe), 15)], comm)
	require.Positive(t, ticks)
	require.GreaterOrEqual(t, CommandTicks(comm), ticks, "every process of the name, this one included")

	_, _, err = ProcessTicks("0")
	require.Error(t, err, "no process 0 in /proc")
}

func TestCallgrindTotal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cg.1")
	require.NoError(t, os.WriteFile(path, []byte("events: Ir\nfn=main\n1 5\nsummary: 123\ntotals: 4567\n"), 0o600))
	n, err := CallgrindTotal(path)
	require.NoError(t, err)
	require.Equal(t, int64(4567), n)
}
