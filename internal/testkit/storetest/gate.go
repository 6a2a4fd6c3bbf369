package storetest

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The gate keeps the concurrency topic's 65 connections (64 acquirers and
// a check) apart from every other topic's, on every test binary of the
// machine: together, several stores and exec modes would exceed
// PostgreSQL's default max_connections of 100. Every topic runs inside the
// gate shared; the 64 acquirers run inside it alone, once the topics
// running meanwhile have ended and their pools' idle connections have
// closed (testdb.IdleTime). In a process the gate is a sync.RWMutex, which
// lets no new topic in while the acquirers wait; across processes, a file
// lock shared by the processes that run topics and taken alone by the one
// that runs acquirers, behind a second file lock (the turnstile) that the
// acquirers' process holds while it waits, so that no process starts a
// topic meanwhile.

var gate struct {
	rw sync.RWMutex // shared by topics, alone by acquirers
	mu sync.Mutex   // guards topics and the shared file lock
	// topics is how many topics of the process are inside the gate; the
	// process holds the file lock shared while there are any.
	topics int
}

// gateFiles opens the gate's two lock files, once.
var gateFiles = sync.OnceValues(func() ([2]*os.File, error) {
	var fs [2]*os.File
	for i, name := range []string{"txlimit-storetest-gate.lock", "txlimit-storetest-turnstile.lock"} {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), name), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return fs, err
		}
		fs[i] = f
	}
	return fs, nil
})

// enterShared runs a topic inside the gate, until leave is called.
func enterShared(t *testing.T) (leave func()) {
	files, err := gateFiles()
	require.NoError(t, err)
	gate.rw.RLock()
	// Through the turnstile, which a process waiting to run its acquirers
	// holds, so that the topics of this process drain meanwhile.
	if err := syscall.Flock(int(files[1].Fd()), syscall.LOCK_SH); err != nil {
		gate.rw.RUnlock()
		t.Fatalf("the gate's turnstile: %v", err)
	}
	_ = syscall.Flock(int(files[1].Fd()), syscall.LOCK_UN)
	gate.mu.Lock()
	if gate.topics == 0 {
		if err := syscall.Flock(int(files[0].Fd()), syscall.LOCK_SH); err != nil {
			gate.mu.Unlock()
			gate.rw.RUnlock()
			t.Fatalf("the gate: %v", err)
		}
	}
	gate.topics++
	gate.mu.Unlock()
	return func() {
		gate.mu.Lock()
		gate.topics--
		if gate.topics == 0 {
			_ = syscall.Flock(int(files[0].Fd()), syscall.LOCK_UN)
		}
		gate.mu.Unlock()
		gate.rw.RUnlock()
	}
}

// enterAlone runs the concurrency topic's acquirers inside the gate alone,
// until t ends, and then waits, where the harness can tell (Headroom), up
// to two minutes for the server to have room for acquirers+1 connections
// and a margin for the tests that do not run inside the gate.
func enterAlone[TTx any](t *testing.T, h Harness[TTx]) {
	files, err := gateFiles()
	require.NoError(t, err)
	gate.rw.Lock()
	require.NoError(t, syscall.Flock(int(files[1].Fd()), syscall.LOCK_EX))
	require.NoError(t, syscall.Flock(int(files[0].Fd()), syscall.LOCK_EX))
	t.Cleanup(func() {
		_ = syscall.Flock(int(files[0].Fd()), syscall.LOCK_UN)
		_ = syscall.Flock(int(files[1].Fd()), syscall.LOCK_UN)
		gate.rw.Unlock()
	})
	if h.Headroom == nil {
		return
	}
	const margin = 20
	deadline := time.Now().Add(2 * time.Minute)
	for {
		free, err := h.Headroom(context.Background())
		require.NoError(t, err)
		if free >= acquirers+1+margin {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("the server has room for %d more connections, not %d: going on", free, acquirers+1+margin)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
