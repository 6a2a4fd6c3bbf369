package riverlimit_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/riverlimit"
)

// The killed worker's process: the test binary run again with
// killedSchema set, printing killedLine lines.
const (
	killedSchema  = "RIVERLIMIT_TEST_KILLED_SCHEMA"
	killedLine    = "riverlimit-killed-worker:"
	killedLimit   = "jobs"
	killedHoldFor = 3 * time.Second
)

var killedLimits = map[string]txlimit.Config{killedLimit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: killedHoldFor}}

// TestKilledWorker: a River worker killed with SIGKILL in the middle of a job
// frees the job's slot at its expiry (HoldFor after its last heartbeat) and
// not before. The worker is a process of its own (this test binary run
// again: killedWorker) whose River client works job A of tenant t, the only
// slot of the tenant, extends it once and is killed. On the database's
// clock every check after its death says the slot is taken until that
// expiry, with RetryAfter until it, also in the last half of HoldFor; the
// first that finds it free comes at the expiry or later. Job B of the same
// tenant, worked by this process's own River client from the moment A
// runs, is snoozed while A's worker lives and after its death until then,
// and granted at the expiry or later, reclaiming the dead job's slot.
func TestKilledWorker(t *testing.T) {
	if schema := os.Getenv(killedSchema); schema != "" {
		killedWorker(t, schema)
		return
	}
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, killedLimits)
	inserter := e.client(t, nil, 0)
	a := insert(t, inserter, tenantArgs{Tenant: "t", Seq: 0})[0]

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWorker$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), killedSchema+"="+e.schema)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan []string, 16)
	exited := make(chan error, 1)
	var transcript lockedText
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			transcript.add(sc.Text())
			if rest, ok := strings.CutPrefix(sc.Text(), killedLine); ok {
				lines <- strings.Fields(rest)
			}
		}
		_, _ = io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	// The child's lines: "grant <µs>" (the acquire, on the database's
	// clock), "holding <job id>" (inside the job), "extend <µs>" (a
	// heartbeat that committed). Killed right after its first heartbeat, so
	// that the next (HoldFor/3 later) never starts.
	var last time.Time
	holding := false
	// Job B of the same tenant, worked here once A runs in the worker
	// (whose one River worker is then busy: it fetches no more jobs).
	bRan := make(chan struct{}, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		bRan <- struct{}{}
		return nil
	}})
	var worker *river.Client[pgx.Tx]
	var b int64
	for extended := false; !extended; {
		select {
		case f := <-lines:
			switch f[0] {
			case "grant", "extend":
				us, err := strconv.ParseInt(f[1], 10, 64)
				require.NoError(t, err)
				last = time.UnixMicro(us)
				extended = f[0] == "extend"
				require.True(t, holding || f[0] == "grant", "extended before the job ran")
			case "holding":
				require.Equal(t, strconv.FormatInt(a, 10), f[1])
				holding = true
				worker = e.client(t, workers, 1, e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(killedLimit)},
					SlotWait: 200 * time.Millisecond, Spread: 100 * time.Millisecond}))
				b = insert(t, worker, tenantArgs{Tenant: "t", Seq: 1})[0]
			}
		case err := <-exited:
			killed = true
			t.Fatalf("the worker exited before it held its slot (%v):\n%s%s", err, transcript.String(), stderr.String())
		case <-time.After(2 * time.Minute):
			t.Fatalf("the worker did not hold and extend its slot in 2 minutes:\n%s%s", transcript.String(), stderr.String())
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = <-exited
	killed = true
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"the worker died of SIGKILL, not on its own (%v):\n%s%s", err, transcript.String(), stderr.String())
	// The slot's expiry, as the database has it: HoldFor after the last
	// heartbeat the worker printed, or, rarely, after one more that
	// committed between that line and the kill (a tick queued behind a slow
	// heartbeat).
	first, err := e.limiter.Check(ctx, killedLimit, "t")
	require.NoError(t, err)
	require.False(t, first.OK, "the dead job's slot is still taken right after the kill")
	expiry := first.At.Add(first.RetryAfter)
	if late := expiry.Sub(last.Add(killedHoldFor)); late != 0 {
		t.Logf("the slot expires %v after HoldFor from the last printed heartbeat", late)
		require.Positive(t, late, "the slot expires before HoldFor after the last heartbeat")
		require.LessOrEqual(t, late, killedHoldFor/3+time.Second, "more than one heartbeat after the last printed")
	}

	// The dead job's slot, as checks see it until the expiry: taken, with
	// RetryAfter until the expiry. From the expiry on, free, or B's (which
	// the events below check).
	lateTaken := false
	for attempt := 0; ; attempt++ {
		res, err := e.limiter.Check(ctx, killedLimit, "t")
		require.NoError(t, err)
		if !res.At.Before(expiry) {
			break
		}
		require.False(t, res.OK, "free at %v, before the expiry %v", res.At, expiry)
		require.Equal(t, expiry.Sub(res.At), res.RetryAfter, "the check says when the dead job's slot comes back")
		lateTaken = lateTaken || !res.At.Before(expiry.Add(-killedHoldFor/2))
		time.Sleep(max(min(res.RetryAfter-250*time.Millisecond, res.RetryAfter/2), 20*time.Millisecond))
		require.Less(t, attempt, 10_000)
	}
	require.True(t, lateTaken, "the dead job's slot was still taken in the last half of HoldFor")

	select {
	case <-bRan:
	case <-time.After(time.Minute):
		t.Fatal("job B did not run after the dead job's slot expired")
	}
	jobs := e.waitFinal(t, worker, []int64{b}, time.Minute)
	require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
	var bDenied int
	var bGrant time.Time
	var reclaimed []string
	for _, ev := range e.events.of("") {
		switch {
		case ev.Op == "limit_all" && ev.Holder == riverlimit.Holder(jobs[0]):
			if ev.Result.OK {
				bGrant = ev.Result.At
			} else {
				bDenied++
				require.True(t, ev.Result.At.Before(expiry), "B denied at %v, after the expiry %v", ev.Result.At, expiry)
			}
		case ev.Op == "reclaim":
			reclaimed = append(reclaimed, ev.Holder)
		}
	}
	require.Positive(t, bDenied, "B was snoozed while the dead job held the slot")
	require.False(t, bGrant.Before(expiry), "B granted at %v, before the expiry %v", bGrant, expiry)
	require.Less(t, bGrant.Sub(expiry), 5*time.Second, "B, snoozed for 200-300ms at a time, came back soon after the expiry")
	require.Equal(t, []string{fmt.Sprintf("river-job-%d", a)}, reclaimed, "B's grant reclaimed the dead job's slot")
	_, err = inserter.JobGet(ctx, a)
	require.NoError(t, err)
}

// killedWorker is TestKilledWorker in the worker's process: a River client
// with the middleware on schema works job A, printing the grant and every
// heartbeat (their instants on the database's clock) and, inside the job,
// that it holds the slot; the job then waits to be killed.
func killedWorker(t *testing.T, schema string) {
	print := func(format string, args ...any) { fmt.Printf(killedLine+" "+format+"\n", args...) }
	e := openEnv(t, schema, killedLimits, func(ev txlimit.Event) {
		if ev.Err != nil || !ev.Result.OK {
			return
		}
		switch ev.Op {
		case "limit_all":
			print("grant %d", ev.Result.At.UnixMicro())
		case "extend":
			print("extend %d", ev.Result.At.UnixMicro())
		}
	})
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		print("holding %d", job.ID)
		for {
			time.Sleep(time.Hour)
		}
	}})
	e.client(t, workers, 1, e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(killedLimit)}}))
	for {
		time.Sleep(time.Hour)
	}
}

// lockedText is a transcript safe for concurrent use.
type lockedText struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedText) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(line + "\n")
}

func (l *lockedText) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
