//go:build failover

package pgstore_test

// A switchover under load on a real pg_auto_failover formation (a monitor,
// a primary and a synchronous standby, brought up by scripts/failover.sh):
// no acknowledged grant is lost, no token is spent without its business row,
// nothing goes over the limit, and every error the clients see is one
// pgstore.Retryable tells them to retry.
//
// The test is built only with -tags failover: about one run in 20 once lost
// acknowledged commits across the switchover, a cause not proven (likeliest:
// the monitor turned synchronous replication off, wait_primary; the test then
// prints its events); see docs/scale-out.md. Until that is understood it must
// not make CI flaky, and a test CI skips would be a skip in CI's log:
//
//	scripts/failover.sh install
//	go test -tags failover -run TestFailoverSwitchover -v ./pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// Ports of the formation: the monitor and two nodes.
const failoverPortLo, failoverPortHi = 6450, 6469

type failoverErr struct {
	stage     string // begin, insert, limit, commit
	retryable bool
	code      string
	text      string
}

func (e failoverErr) String() string {
	return fmt.Sprintf("%s: retryable=%v sqlstate=%q %s", e.stage, e.retryable, e.code, e.text)
}

func TestFailoverSwitchover(t *testing.T) {
	testdb.Need(t, "pg_autoctl", "scripts/failover.sh install")
	dir := testdb.ServiceDir(t, "txlimit-failover-")
	ports := []string{}
	for range 3 {
		ports = append(ports, fmt.Sprint(testdb.FreePort(t, failoverPortLo, failoverPortHi)))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "../scripts/failover.sh", "down", dir).CombinedOutput(); err != nil {
			t.Logf("failover.sh down: %v\n%s", err, out)
		}
		if t.Failed() {
			// The monitor's state changes say whether the primary ran
			// without its synchronous standby (wait_primary) at some point:
			// commits acknowledged then live on the primary alone.
			if out, err := exec.Command("../scripts/failover.sh", "events", dir).CombinedOutput(); err == nil {
				t.Logf("--- monitor events\n%s", out)
			}
			for _, f := range []string{"monitor.log", "node1.log", "node2.log", "switchover.log"} {
				b, _ := os.ReadFile(dir + "/" + f)
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("--- %s (tail)\n%s", f, b)
			}
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	began := time.Now()
	out, err := exec.CommandContext(ctx, "../scripts/failover.sh", append([]string{"up", dir}, ports...)...).CombinedOutput()
	require.NoError(t, err, "failover.sh up:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dsn := lines[len(lines)-1]
	t.Logf("formation up in %v: %s", time.Since(began).Round(time.Second), dsn)

	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 20
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, migrations.Up(ctx, stdlib.OpenDBFromPool(pool), migrations.Postgres))
	_, err = pool.Exec(ctx, `CREATE TABLE failover_biz (id bigint PRIMARY KEY, n integer NOT NULL)`)
	require.NoError(t, err)
	var syncNames string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&syncNames))
	require.NotEmpty(t, syncNames, "the standby is synchronous")

	// A frozen clock: the bucket never refills, so every token spent is
	// one of the 1,000,000 it starts with.
	const capacity = 1_000_000
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	name := storetest.UniqueName(t, "failover")
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour},
	}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)

	const clients = 16
	var (
		draining atomic.Bool
		acks     atomic.Int64 // acknowledged grants, all phases
		mu       sync.Mutex
		acked    = map[int64]int{} // id -> tokens, commit returned nil
		unknown  = map[int64]int{} // id -> tokens, commit returned an error
		errs     []failoverErr
		denials  atomic.Int64 // denials before the drain: must be none
	)
	record := func(stage string, err error) {
		e := failoverErr{stage: stage, retryable: pgstore.Retryable(err), text: err.Error()}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			e.code = pgErr.Code
		}
		mu.Lock()
		errs = append(errs, e)
		mu.Unlock()
	}

	// One business transaction: a row in failover_biz and n tokens of the
	// limit, committed together. The id is unique per attempt, so that
	// afterwards the table tells which commits happened.
	type outcome int
	const (
		granted outcome = iota
		denied
		failed
	)
	attempt := func(id int64, n int) outcome {
		txCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		tx, err := pool.Begin(txCtx)
		if err != nil {
			record("begin", err)
			return failed
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(txCtx, `INSERT INTO failover_biz (id, n) VALUES ($1, $2)`, id, n); err != nil {
			record("insert", err)
			return failed
		}
		res, err := l.LimitTx(txCtx, tx, name, "k", txlimit.Count(float64(n)))
		if err != nil {
			record("limit", err)
			return failed
		}
		if !res.OK {
			return denied
		}
		mu.Lock()
		unknown[id] = n
		mu.Unlock()
		if err := tx.Commit(txCtx); err != nil {
			record("commit", err)
			return failed
		}
		mu.Lock()
		delete(unknown, id)
		acked[id] = n
		mu.Unlock()
		acks.Add(1)
		return granted
	}

	var (
		wg       sync.WaitGroup
		firstErr atomic.Int64 // unix nanos of the first and last error
		lastErr  atomic.Int64
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Until the drain, one token a transaction. Then steps of
			// 10000, 1000, 100, 10 and 1, each until its first denial, so
			// that the limit ends exactly empty in a few hundred
			// transactions.
			steps := []int{1, 10000, 1000, 100, 10, 1}
			level := 0
			for seq := int64(0); ctx.Err() == nil; seq++ {
				if level == 0 && draining.Load() {
					level = 1
				}
				switch attempt(int64(c)<<40|seq, steps[level]) {
				case denied:
					switch {
					case level == 0:
						denials.Add(1)
					case level == len(steps)-1:
						return
					default:
						level++
					}
				case failed:
					now := time.Now().UnixNano()
					firstErr.CompareAndSwap(0, now)
					lastErr.Store(now)
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}

	waitAcks := func(n int64) {
		for acks.Load() < n && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitAcks(300)
	switchStart, acksBefore := time.Now(), acks.Load()
	out, err = exec.CommandContext(ctx, "../scripts/failover.sh", "switchover", dir).CombinedOutput()
	switchTook, acksDuring := time.Since(switchStart), acks.Load()-acksBefore
	if err != nil {
		draining.Store(true)
		cancel()
		wg.Wait()
		t.Fatalf("failover.sh switchover: %v\n%s", err, out)
	}
	waitAcks(acks.Load() + 300)
	draining.Store(true)
	wg.Wait()
	require.NoError(t, ctx.Err(), "the run ended by its deadline, not by draining the limit")
	var window time.Duration
	if firstErr.Load() > 0 {
		window = time.Duration(lastErr.Load() - firstErr.Load())
	}
	t.Logf("switchover took %v; %d grants acknowledged while it ran; errors from first to last: %v; %d errors",
		switchTook.Round(time.Millisecond), acksDuring, window.Round(time.Millisecond), len(errs))

	// Every error is one the client may retry from BEGIN.
	kinds := map[string]int{}
	ephemeral := regexp.MustCompile(`:[0-9]+->`) // a client's local port
	for _, e := range errs {
		kinds[ephemeral.ReplaceAllString(e.String(), ":…->")]++
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var notRetryable []string
	for _, k := range keys {
		t.Logf("%5d × %s", kinds[k], k)
		if strings.Contains(k, "retryable=false") {
			notRetryable = append(notRetryable, k)
		}
	}
	require.Empty(t, notRetryable, "errors pgstore.Retryable does not classify as retryable")

	// Not seen in every switchover, but possible with any failover tool: a
	// moment when no host accepts read-write sessions. Connect with
	// target_session_attrs=read-write to the standby alone to get that
	// error, and report how it is classified.
	standby := strings.Replace(dsn, ",127.0.0.1:"+ports[2], "", 1) // node1, the old primary
	if conn, err := pgx.Connect(context.Background(), standby); err == nil {
		_ = conn.Close(context.Background())
		t.Logf("the old primary accepted a read-write session after the switchover: %s", standby)
	} else {
		t.Logf("no read-write host: pgstore.Retryable=%v for %q", pgstore.Retryable(err), err)
	}
	require.Zero(t, denials.Load(), "no denial before the drain: the limit had room")

	// The business rows tell which commits happened: every acknowledged
	// one, plus those whose COMMIT errored but went through.
	rows, err := pool.Query(context.Background(), `SELECT id, n FROM failover_biz`)
	require.NoError(t, err)
	committed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var v [2]int64
		return v, r.Scan(&v[0], &v[1])
	})
	require.NoError(t, err)
	inTable := map[int64]int64{}
	var tableSum int64
	for _, r := range committed {
		inTable[r[0]] = r[1]
		tableSum += r[1]
	}
	var ackedSum, unknownCommitted, unknownCommittedSum int64
	var lost []int64
	for id, n := range acked {
		if _, ok := inTable[id]; !ok {
			lost = append(lost, id)
		}
		ackedSum += int64(n)
	}
	require.Empty(t, lost, "acknowledged commits lost: %d of %d (the monitor's events follow)", len(lost), len(acked))
	for id, n := range unknown {
		if _, ok := inTable[id]; ok {
			unknownCommitted++
			unknownCommittedSum += int64(n)
		}
	}
	for id := range inTable {
		_, a := acked[id]
		_, u := unknown[id]
		require.True(t, a || u, "row %d committed by a transaction that failed before COMMIT", id)
	}
	t.Logf("%d grants acknowledged (%d tokens); %d commits errored, %d of them committed (%d tokens)",
		len(acked), ackedSum, len(unknown), unknownCommitted, unknownCommittedSum)

	snap, err := l.Check(context.Background(), name, "k", txlimit.Count(0))
	require.NoError(t, err)
	consumed := capacity - int64(snap.Remaining)
	require.Equal(t, ackedSum+unknownCommittedSum, tableSum)
	require.Equal(t, tableSum, consumed, "consumed tokens == acknowledged grants + errored commits that committed")
	require.Zero(t, snap.Remaining, "drained to exactly zero: nothing over the limit")
}
