package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// Ports of the throwaway cluster of TestEscrowPostgresCrash.
const crashPortLo, crashPortHi = 7040, 7049

// TestEscrowPostgresCrash kills a PostgreSQL cluster of its own with
// SIGKILL (postmaster and every backend at once) while escrow callers are
// in flight, restarts it (crash recovery), and checks that nothing was lost
// or duplicated: after settlement, the committed business rows equal the
// tokens the limit lost. The WAL writer is slowed to 10 s so that the
// debits, committed with synchronous_commit off, are still in memory when
// the cluster dies: a debit whose caller never committed may be lost, and
// losing it must return its tokens; a caller's durable commit carries its
// debit with it.
func TestEscrowPostgresCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and crashes a PostgreSQL cluster of its own (about 10 s)")
	}
	t.Parallel()
	ctx := context.Background()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	initdb := testdb.Need(t, "initdb", "scripts/postgres.sh", dirs...)
	postgres := testdb.Need(t, "postgres", "scripts/postgres.sh", filepath.Dir(initdb))
	dir := testdb.ServiceDir(t, "txlimit-escrow-crash-")
	data := filepath.Join(dir, "data")
	out, err := testdb.AsServiceUser(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	port := testdb.FreePort(t, crashPortLo, crashPortHi)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)

	var server *exec.Cmd
	var serverDone chan struct{}
	start := func() {
		server = testdb.AsServiceUser(context.Background(), postgres, "-D", data, "-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=30", "-c", "wal_writer_delay=10000ms",
			"-c", "shared_buffers=16MB")
		logPath := filepath.Join(t.TempDir(), "postgres.log")
		logFile, err := os.Create(logPath)
		require.NoError(t, err)
		server.Stdout, server.Stderr = logFile, logFile
		require.NoError(t, server.Start())
		done := make(chan struct{})
		go func() { _ = server.Wait(); _ = logFile.Close(); close(done) }()
		serverDone = done
		deadline := time.Now().Add(60 * time.Second)
		for {
			conn, err := pgx.Connect(ctx, url)
			if err == nil {
				_ = conn.Close(ctx)
				return
			}
			if time.Now().After(deadline) {
				log, _ := os.ReadFile(logPath)
				t.Fatalf("the cluster does not answer: %v\n%s", err, log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	crash := func() {
		// SIGKILL to the postmaster and to every one of its children (the
		// backends, the WAL writer, the checkpointer), found by their
		// parent pid, all at once: nothing gets to flush or clean up.
		pidFile, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
		require.NoError(t, err)
		pm, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
		require.NoError(t, err)
		victims := append(childrenOf(pm), pm)
		for _, pid := range victims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = syscall.Kill(-server.Process.Pid, syscall.SIGKILL)
		<-serverDone
		require.Eventually(t, func() bool {
			for _, pid := range victims {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
					return false
				}
			}
			return true
		}, 10*time.Second, 50*time.Millisecond, "the cluster's processes did not die")
	}
	start()
	t.Cleanup(func() { testdb.Stop(server, serverDone, 10*time.Second) })

	admin, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, stdlib.OpenDBFromPool(admin), migrations.Postgres))
	_, err = admin.Exec(ctx, "CREATE TABLE business (id bigserial PRIMARY KEY, worker int NOT NULL)")
	require.NoError(t, err)
	admin.Close()

	newPool := func(conns int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = conns
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	callers, storePool := newPool(12), newPool(4)
	const capacity = 1e6
	name := "crash"
	l := escrowLimiter(t, pgstore.New(storePool, pgstore.EscrowSettleEvery(0)), map[string]txlimit.Config{
		name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: time.Hour, Escrow: true},
	}, func() time.Time { return storetest.T0 })

	var acknowledged, attempts atomic.Int64
	// up is open (not closed) from the crash until the restarted cluster
	// answers. A caller whose call failed waits for it before it tries
	// again, instead of asking every 20 ms for a connection that the
	// recovering cluster refuses: each refusal forks a server process
	// (about 10 ms of CPU on a small VM), and that storm cost the test two
	// thirds of its CPU. The callers in flight at the crash are unaffected.
	var upMu sync.Mutex
	up := make(chan struct{}) // closed while the cluster is up
	close(up)
	waitUp := func() {
		upMu.Lock()
		ch := up
		upMu.Unlock()
		<-ch
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				attempts.Add(1)
				callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := pgx.BeginFunc(callCtx, callers, func(tx pgx.Tx) error {
					if _, err := tx.Exec(callCtx, "INSERT INTO business (worker) VALUES ($1)", w); err != nil {
						return err
					}
					res, err := l.LimitTx(callCtx, tx, name, "")
					if err == nil && !res.OK {
						err = fmt.Errorf("denied with %v tokens", res.Remaining)
					}
					return err
				})
				cancel()
				if err == nil {
					acknowledged.Add(1)
				} else {
					time.Sleep(20 * time.Millisecond) // the server is going down
					waitUp()
				}
			}
		}()
	}
	// Crash once the callers are well under way, and stop once they are
	// again after the restart: waiting for commits, not for a fixed time,
	// is quick on an idle machine and still enough on a loaded one.
	const progress = 200
	require.Eventually(t, func() bool { return acknowledged.Load() >= progress }, time.Minute, 10*time.Millisecond,
		"callers committed before the crash")
	before := acknowledged.Load()
	upMu.Lock()
	up = make(chan struct{})
	upMu.Unlock()
	crash()
	start()
	close(up)
	require.Eventually(t, func() bool { return acknowledged.Load() >= before+progress }, time.Minute, 10*time.Millisecond,
		"callers committed after the restart")
	close(stop)
	wg.Wait()
	require.Positive(t, before, "callers committed before the crash")
	require.Greater(t, acknowledged.Load(), before, "callers committed after the restart")

	var settled driver.SettleResult
	require.Eventually(t, func() bool {
		settled, err = l.Settle(ctx, 0)
		return err == nil && settled.Pending == 0
	}, 30*time.Second, 200*time.Millisecond, "settle: %v", err)
	check := newPool(1)
	var rows int64
	require.NoError(t, check.QueryRow(ctx, "SELECT count(*) FROM business").Scan(&rows))
	snap, err := l.Value(ctx, name, "")
	require.NoError(t, err)
	require.Equal(t, float64(rows), capacity-snap.Value, "committed business rows equal the tokens spent")
	require.GreaterOrEqual(t, rows, acknowledged.Load(), "every acknowledged commit survived")
	var pending, claims int64
	require.NoError(t, check.QueryRow(ctx,
		"SELECT (SELECT count(*) FROM txlimit_escrow), (SELECT count(*) FROM txlimit_escrow_claim)").Scan(&pending, &claims))
	require.Zero(t, pending)
	require.Zero(t, claims)
	t.Logf("%d attempts, %d acknowledged (%d before the crash), %d business rows, %d refunded at the last settle",
		attempts.Load(), acknowledged.Load(), before, rows, settled.Refunded)
}

// childrenOf returns the pids of the processes whose parent is pid, from
// /proc (Linux).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces, so split after ')'.
		rest := string(stat)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) >= 2 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
