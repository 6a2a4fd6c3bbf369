package pgstore_test

// Leases (Config.Lease) on a real PostgreSQL, where they can go wrong:
// a process holding a lease killed with SIGKILL, a caller that stalls past
// its lease's end, a clock that jumps, and several Limiters (processes)
// leasing one hot key at once. Every test keeps an exact ledger: the rows
// of a business table (one per granted call, inserted in the caller's
// transaction), the limit's value and the tokens held in leases add up to
// what the limit holds; never more (no over-admission), and the tokens a
// lease parks or loses are bounded by Lease.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// leaseEnv is a schema with a business table, read through admin.
type leaseEnv struct {
	schema string
	admin  *pgxpool.Pool
}

func newLeaseEnv(t *testing.T) *leaseEnv {
	t.Helper()
	schema := testdb.Schema(t)
	admin := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	_, err := admin.Exec(context.Background(), `CREATE TABLE business (id bigserial PRIMARY KEY, who text NOT NULL)`)
	require.NoError(t, err)
	return &leaseEnv{schema: schema, admin: admin}
}

// insert is a granted call's work: one business row of who.
func insert(ctx context.Context, tx pgx.Tx, who string) error {
	_, err := tx.Exec(ctx, `INSERT INTO business (who) VALUES ($1)`, who)
	return err
}

// rows counts the committed business rows of who, or all of them for "".
func (e *leaseEnv) rows(t *testing.T, who string) int {
	t.Helper()
	var n int
	require.NoError(t, e.admin.QueryRow(context.Background(),
		`SELECT count(*) FROM business WHERE $1 = '' OR who = $1`, who).Scan(&n))
	return n
}

func snapshot(t *testing.T, l *txlimit.Limiter[pgx.Tx], name string) txlimit.Result {
	t.Helper()
	s, err := l.Check(context.Background(), name, "k", txlimit.Count(0))
	require.NoError(t, err)
	return s
}

func leaseReq(name string) txlimit.Request { return txlimit.Request{Name: name, Key: "k"} }

// lockedBuffer is the child's output, read while it may still be written.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The child process of TestLeaseHolderKilled: the test binary run again
// with these variables set.
const (
	leaseChildSchema = "TXLIMIT_LEASE_CHILD_SCHEMA"
	leaseChildName   = "TXLIMIT_LEASE_CHILD_NAME"
	leaseChildClock  = "TXLIMIT_LEASE_CHILD_CLOCK" // Unix microseconds of the frozen clock
	leaseChildApp    = "TXLIMIT_LEASE_CHILD_APP"   // application_name of its connections
)

// killedLimit is the limit of TestLeaseHolderKilled, in parent and child:
// a fixed window of 50 an hour whose window holds the frozen clock, leased
// 8 at a time.
func killedLimit(frozen time.Time) txlimit.Config {
	return txlimit.Config{Kind: txlimit.FixedWindow, Rate: 50, Period: time.Hour,
		Start: frozen.Add(-time.Minute), Lease: 8}
}

// TestLeaseHolderKilled: a process killed with SIGKILL while it holds a
// lease loses the lease's unspent tokens (nobody gives them back), and
// nothing else: the limit admits at most Lease fewer, never more. The
// child (this test binary run again) calls Commit in a loop on a frozen
// clock, one business row per grant; it is killed once 10 rows are in.
// The parent, with a Limiter of its own on the same clock, then drains the
// limit: it gets exactly the limit's value after the child's death, and
// child rows + parent rows = 50 - lost with 0 <= lost <= 8.
func TestLeaseHolderKilled(t *testing.T) {
	if os.Getenv(leaseChildSchema) != "" {
		leaseChild(t)
		return
	}
	t.Parallel()
	ctx := context.Background()
	const capacity, lease, killAt = 50, 8, 10
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "killed")
	frozen := storetest.T0
	app := "txlimit_lease_child_" + e.schema[len("txlimit_test_"):]

	var out lockedBuffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHolderKilled$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		leaseChildSchema+"="+e.schema,
		leaseChildName+"="+name,
		leaseChildClock+"="+strconv.FormatInt(frozen.UnixMicro(), 10),
		leaseChildApp+"="+app)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	// Kill it mid-stream, as soon as it has committed killAt rows: it is
	// then between calls, in a transaction of its work, or taking a lease.
	deadline := time.Now().Add(15 * time.Second)
	for e.rows(t, "child") < killAt {
		select {
		case err := <-exited:
			killed = true
			t.Fatalf("the child exited before it was killed (%v):\n%s", err, out.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "the child committed %d rows in 15 s:\n%s", e.rows(t, "child"), out.String())
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := <-exited
	killed = true
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"the child died of SIGKILL, not on its own (%v):\n%s", err, out.String())

	// The server rolls back what the child's connections had open when
	// their backends see the sockets closed: wait for them to exit.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, e.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		return n == 0
	}, 10*time.Second, 10*time.Millisecond, "the child's backends are gone")

	l, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 2)),
		map[string]txlimit.Config{name: killedLimit(frozen)}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)
	child := e.rows(t, "child")
	left := snapshot(t, l, name).Remaining
	// What the child's committed leases took, less what it committed, is
	// what died with it: the lease's unspent tokens and a token in flight.
	lost := capacity - int(left) - child
	require.Equal(t, float64(int(left)), left, "whole tokens")
	require.GreaterOrEqual(t, lost, 0, "a token committed in the child's work came from a lease the child took: never over-admission")
	require.LessOrEqual(t, lost, lease, "a dead process loses at most Lease tokens")
	require.Zero(t, snapshot(t, l, name).Leased)

	parent := 0
	for {
		_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "parent") }, leaseReq(name))
		if errors.Is(err, txlimit.ErrRateLimited) {
			break
		}
		require.NoError(t, err)
		parent++
		require.LessOrEqual(t, parent, capacity, "the parent is never denied")
	}
	require.Equal(t, parent, e.rows(t, "parent"), "a business row per grant")
	require.Equal(t, int(left), parent, "the parent gets exactly what the child left in the limit")
	total := child + parent
	require.LessOrEqual(t, total, capacity, "never over-admission")
	require.GreaterOrEqual(t, total, capacity-lease, "the child's lost tokens are bounded by Lease")
	require.Equal(t, capacity-lost, total)

	require.NoError(t, l.ReturnLeases(ctx))
	s := snapshot(t, l, name)
	require.Zero(t, s.Remaining+s.Leased, "the limit is drained, nothing parked")
	t.Logf("child committed %d, parent %d: %d of %d admitted, %d tokens lost with the killed lease", child, parent, total, capacity, lost)
}

// leaseChild is the child of TestLeaseHolderKilled: Commit in a loop,
// one business row per grant, until it is killed (or 30 s pass). The work
// sleeps in its transaction and between calls, so that a kill lands in
// either.
func leaseChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	us, err := strconv.ParseInt(os.Getenv(leaseChildClock), 10, 64)
	require.NoError(t, err)
	frozen := time.UnixMicro(us).UTC()
	name := os.Getenv(leaseChildName)
	pool := testdb.PoolParams(t, os.Getenv(leaseChildSchema), pgx.QueryExecModeCacheStatement, 2,
		map[string]string{"application_name": os.Getenv(leaseChildApp)})
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{name: killedLimit(frozen)},
		&txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)
	for i := 0; ctx.Err() == nil; i++ {
		_, err := l.Commit(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, "child"); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond)
			return nil
		}, leaseReq(name))
		if errors.Is(err, txlimit.ErrRateLimited) {
			t.Logf("denied at call %d: waiting to be killed", i)
			<-ctx.Done()
			break
		}
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the child was not killed")
}

// TestLeaseStalledHolder: callers that hold a leased token past the
// lease's end (LeaseFor 50 ms, real clock) while others drain the limit.
// The lease they took from ends under them, at the others' next call, and
// its unspent tokens go back; A then commits, and its token is counted
// once; B's transaction fails, and its token goes back to the limit, not
// to the lease that replaced its own.
func TestLeaseStalledHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capacity = 20
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "stalled")
	l, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 8)), map[string]txlimit.Config{
		name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: time.Hour, Start: time.Now().Add(-time.Minute).Truncate(time.Second),
			Lease: 4, LeaseFor: 50 * time.Millisecond},
	}, nil)
	require.NoError(t, err)

	releaseA, doneA := stall(t, l, name, "A", nil)
	releaseB, doneB := stall(t, l, name, "B", errFailed)
	s := snapshot(t, l, name)
	// One lease of 4, with 2 left; or, when B came more than LeaseFor
	// after A (a loaded machine), a second lease of 4 with 3 left, the
	// first one's 3 given back.
	require.Equal(t, float64(capacity-2), s.Remaining+s.Leased, "all but A's and B's tokens in the limit or the lease")
	require.Contains(t, []float64{2, 3}, s.Leased)

	// The lease ends (LeaseFor) while A and B hold its tokens.
	time.Sleep(60 * time.Millisecond)

	// Others drain the limit: the first call ends the lease, whose unspent
	// tokens go back (18 in the limit), and they get exactly those.
	var others atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "other") }, leaseReq(name))
				if errors.Is(err, txlimit.ErrRateLimited) {
					return
				}
				if !assertNoError(t, err) {
					return
				}
				others.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(capacity-2), others.Load(), "the others get all but A's and B's tokens")
	require.Equal(t, capacity-2, e.rows(t, "other"))
	s = snapshot(t, l, name)
	require.Zero(t, s.Remaining)
	require.Zero(t, s.Leased)

	releaseA()
	require.NoError(t, <-doneA, "A commits with the token of a lease that has ended")
	require.Equal(t, 1, e.rows(t, "A"))
	s = snapshot(t, l, name)
	require.Zero(t, s.Remaining+s.Leased, "A's token was spent once")

	releaseB()
	require.ErrorIs(t, <-doneB, errFailed)
	require.Zero(t, e.rows(t, "B"))
	s = snapshot(t, l, name)
	require.Equal(t, float64(1), s.Remaining, "B's token goes back to the limit: its lease has ended")
	require.Zero(t, s.Leased, "not to the lease that replaced B's")

	// That token is the last one.
	_, err = l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "last") }, leaseReq(name))
	require.NoError(t, err)
	_, err = l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "last") }, leaseReq(name))
	require.ErrorIs(t, err, txlimit.ErrRateLimited)
	require.Equal(t, capacity, e.rows(t, ""), "exactly the capacity committed")

	require.NoError(t, l.ReturnLeases(ctx))
	s = snapshot(t, l, name)
	require.Zero(t, s.Remaining+s.Leased)
}

// stall runs a Commit on name's key "k" whose work blocks, after its
// insert of who, until release is called, and then returns fail. A test
// that fails before releases it at cleanup, before the pool's (which waits
// for the connection).
func stall(t *testing.T, l *txlimit.Limiter[pgx.Tx], name, who string, fail error) (release func(), done chan error) {
	t.Helper()
	ctx := context.Background()
	in, ch, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	go func() {
		_, err := l.Commit(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, who); err != nil {
				return err
			}
			close(in)
			<-ch
			return fail
		}, leaseReq(name))
		done <- err
	}()
	select {
	case <-in:
	case err := <-done:
		t.Fatalf("%s's call ended before its work: %v", who, err)
	}
	return release, done
}

// assertNoError is require.NoError for goroutines: it reports err without
// ending the test and says whether there was none.
func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// TestLeaseClockJump: a test clock (Options.Clock) that jumps back an hour
// and forward again. A token bucket of 10 an hour (a token every 6
// minutes), Capacity 10, Lease 4, LeaseFor a minute; the limit's row is
// stamped T0 at the first take, and a call whose clock is behind the row's
// stamp decides at the stamp (no refill, the stamp never moves back). So
// until the clock passes T0 again the limit admits its 10 less the 2 a
// lease ended unspent drops, and 6 minutes past T0 exactly one more.
func TestLeaseClockJump(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "jump")
	clk := storetest.NewClock() // at T0
	l, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 2)), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour, Lease: 4, LeaseFor: time.Minute},
	}, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)
	granted := 0
	call := func(want bool) {
		t.Helper()
		_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "w") }, leaseReq(name))
		if want {
			require.NoError(t, err, "call %d at %v", granted+1, clk.Now())
			granted++
		} else {
			require.ErrorIs(t, err, txlimit.ErrRateLimited, "at %v", clk.Now())
		}
		require.Equal(t, granted, e.rows(t, ""), "a business row per grant")
	}
	state := func(value, leased float64, what string) {
		t.Helper()
		s := snapshot(t, l, name)
		require.Equal(t, value, s.Remaining, "value: %s", what)
		require.Equal(t, leased, s.Leased, "leased: %s", what)
	}

	// T0: the first call takes a lease of 4 (10 → 6, stamped T0), lasting
	// until T0+1m; three calls hand out 3 of it.
	call(true)
	call(true)
	call(true)
	state(6, 1, "T0: a lease of 4, 3 handed out")

	// Back an hour, T0-1h: the lease has not ended (T0+1m is ahead) and
	// hands out its last token.
	clk.Advance(-time.Hour)
	call(true)
	state(6, 0, "T0-1h: the lease's last token")
	// A new lease, taken at T0-1h: the row decides at its stamp T0, with
	// no refill (6 → 2, still stamped T0); it lasts until T0-59m.
	call(true)
	state(2, 3, "T0-1h: a new lease of 4 taken at the row's stamp")
	call(true)
	state(2, 2, "T0-1h: 2 handed out")

	// Forward 2 minutes, T0-58m: the lease has ended, a minute after it was
	// taken. The next call drops its 2 (a token bucket's lease gives its
	// tokens back within LeaseFor or not at all: a later credit could add
	// tokens the Capacity would have cut meanwhile) and takes a new lease
	// of what is left, 2 (2 → 0), until T0-57m.
	clk.Advance(2 * time.Minute)
	state(2, 2, "T0-58m: an ended lease is only ended at the next call")
	call(true)
	state(0, 1, "T0-58m: the ended lease's 2 dropped, a new lease of the 2 left")
	call(true)
	state(0, 0, "T0-58m: all handed out")
	// 8 granted: the capacity less the 2 dropped, and no refill, since the
	// clock has not passed T0. The next call finds the limit empty.
	call(false)
	require.Equal(t, 8, granted)
	require.NoError(t, l.ReturnLeases(ctx))
	state(0, 0, "T0-58m: nothing parked")

	// T0+6m: 6 minutes past the stamp refill exactly 1 token (the stamp
	// never moved back: had it, the hour would have refilled the bucket).
	clk.Advance(64 * time.Minute)
	state(1, 0, "T0+6m: one token refilled")
	call(true)
	call(false)
	require.Equal(t, 9, granted, "capacity 10 + 6 minutes of refill - the 2 dropped")
	require.NoError(t, l.ReturnLeases(ctx))
	state(0, 0, "T0+6m: drained")
}

// TestLeaseManyLimiters: four Limiters (four processes) on one pool lease
// one hot key, 4 goroutines each, 30 Commit calls per goroutine; a
// third of the calls' work fails after its insert (rolled back: the token
// goes back to its lease, or to the limit when that lease has ended).
// Afterwards every grant has its business row and no other row committed;
// grants, the limit's value and the tokens parked in the leases add up to
// exactly 100, the leases parking at most 8 each. ReturnLeases gives those
// back, and one more round takes the limit to exactly 100 rows.
func TestLeaseManyLimiters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capacity, lease, limiters, goroutines, calls = 100, 8, 4, 4, 30
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "hot")
	frozen := storetest.T0
	pool := testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 8)
	cfg := map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: time.Hour,
		Start: frozen.Add(-time.Minute), Lease: lease}}
	ls := make([]*txlimit.Limiter[pgx.Tx], limiters)
	for i := range ls {
		var err error
		ls[i], err = txlimit.New(pgstore.New(pool), cfg, &txlimit.Options{Clock: func() time.Time { return frozen }})
		require.NoError(t, err)
	}

	var tally leaseTally
	var wg sync.WaitGroup
	for _, l := range ls {
		for range goroutines {
			wg.Go(func() {
				for range calls {
					if _, ok := tally.call(ctx, t, l, name); !ok {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	require.False(t, t.Failed())
	grants, denials, failures := &tally.grants, &tally.denials, &tally.failures
	require.Equal(t, int64(limiters*goroutines*calls), grants.Load()+failures.Load()+denials.Load())
	require.Positive(t, denials.Load(), "the demand exceeds the limit")
	g := int(grants.Load())
	require.Equal(t, g, e.rows(t, ""), "a business row per grant, none of a failed or denied call")
	require.LessOrEqual(t, g, capacity, "never over-admission")

	value := snapshot(t, ls[0], name).Remaining
	leased := 0.0
	for i, l := range ls {
		s := snapshot(t, l, name)
		require.Equal(t, value, s.Remaining)
		require.LessOrEqual(t, s.Leased, float64(lease), "limiter %d parks at most Lease", i)
		leased += s.Leased
	}
	require.Equal(t, float64(capacity), float64(g)+value+leased, "grants + value + leased is the capacity: none lost, none invented")
	// What the callers could not get: the tokens parked in the other
	// Limiters' leases, and a token given back to the limit by a failed
	// transaction after the last call that could have taken it (rare).
	require.GreaterOrEqual(t, g, capacity-limiters*lease-int(value), "under-admission bounded by Lease per Limiter")
	t.Logf("%d grants, %d failures, %d denials; then %v in the limit and %v parked in leases",
		g, failures.Load(), denials.Load(), value, leased)

	for _, l := range ls {
		require.NoError(t, l.ReturnLeases(ctx))
	}
	for i, l := range ls {
		s := snapshot(t, l, name)
		require.Equal(t, float64(capacity-g), s.Remaining, "limiter %d: the leases came back", i)
		require.Zero(t, s.Leased)
	}
	// One more round, every Limiter until denied: the rest, exactly.
	for _, l := range ls {
		for {
			_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "w") }, leaseReq(name))
			if errors.Is(err, txlimit.ErrRateLimited) {
				break
			}
			require.NoError(t, err)
			g++
			require.LessOrEqual(t, g, capacity)
		}
	}
	require.Equal(t, capacity, g)
	require.Equal(t, capacity, e.rows(t, ""), "exactly the capacity committed")
	for _, l := range ls {
		require.NoError(t, l.ReturnLeases(ctx))
		s := snapshot(t, l, name)
		require.Zero(t, s.Remaining+s.Leased)
	}
}

var errFailed = fmt.Errorf("the work failed")

// readOnlyBeginHook runs fn, once armed, when a connection of its pool
// begins a read-only transaction: in a lease's take, the read that follows
// a take that found too few tokens (the denial's Check).
type readOnlyBeginHook struct {
	armed atomic.Bool
	fn    func()
}

func (h *readOnlyBeginHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "begin") && strings.Contains(d.SQL, "read only") && h.armed.CompareAndSwap(true, false) {
		h.fn()
	}
	return ctx
}

func (h *readOnlyBeginHook) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLeaseDeniedTakeRacesACredit pins the over-admission that
// TestLeaseManyLimiters finds by chance. A Limiter whose lease is empty
// takes a new one; the take finds no token, and takeLease then asks Check
// for the denial to return. When another process credits a token in
// between (here Limiter B's Credit; in TestLeaseManyLimiters the give-back
// of a failed transaction whose lease had ended), Check answers OK, and
// fromLease hands out a token it never took: the lease goes to -1 tokens
// and the limit still holds the credited one, which is admitted once more.
// Capacity 2 plus the 1 credited allow 3 grants; the bug makes 4.
func TestLeaseDeniedTakeRacesACredit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "race")
	frozen := storetest.T0
	cfg := map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: 2, Period: time.Hour,
		Start: frozen.Add(-time.Minute), Lease: 2}}
	opts := &txlimit.Options{Clock: func() time.Time { return frozen }}
	b, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 2)), cfg, opts)
	require.NoError(t, err)

	// Not require: a FailNow inside pgx would leave its connection acquired.
	hook := &readOnlyBeginHook{fn: func() { assert.NoError(t, b.Credit(ctx, name, "k", 1)) }}
	pc, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["search_path"] = e.schema
	pc.ConnConfig.Tracer = hook
	pc.MaxConns = 2
	poolA, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(poolA.Close)
	a, err := txlimit.New(pgstore.New(poolA), cfg, opts)
	require.NoError(t, err)

	grants := 0
	call := func(l *txlimit.Limiter[pgx.Tx], who string) bool {
		_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, who) }, leaseReq(name))
		if errors.Is(err, txlimit.ErrRateLimited) {
			return false
		}
		require.NoError(t, err)
		grants++
		return true
	}
	require.True(t, call(a, "a"))
	require.True(t, call(a, "a"))
	s := snapshot(t, a, name)
	require.Zero(t, s.Remaining+s.Leased, "A's lease of 2 is handed out")

	// A's next call: its empty lease ends, the take of a new one finds
	// nothing, and B credits a token before the denial's Check.
	hook.armed.Store(true)
	call(a, "a")
	require.False(t, hook.armed.Load(), "the credit ran between the take and the check")
	s = snapshot(t, a, name)
	// Not fatal, so that the over-admission below shows too.
	assert.GreaterOrEqual(t, s.Leased, float64(0), "A's lease never holds fewer than 0 tokens")
	assert.Equal(t, float64(3), float64(grants)+s.Remaining+max(s.Leased, 0), "the ledger: capacity 2 + 1 credited")

	for call(b, "b") {
	}
	for call(a, "a") {
	}
	require.NoError(t, a.ReturnLeases(ctx))
	require.NoError(t, b.ReturnLeases(ctx))
	require.Equal(t, grants, e.rows(t, ""))
	require.LessOrEqual(t, grants, 3, "never over-admission: capacity 2 + 1 credited")
}

// TestLeaseWindowEndCreditsTheNextWindow: a FixedWindow lease ends with
// the window its tokens came from, but its unspent tokens are then
// credited to the limit at the next call for the key, which is in the
// next window. When another process has already taken from that window
// (so that Capacity no longer caps the credit), the window admits more
// than its Rate. Rate 10 an hour, Capacity 10 (no rollover), Lease 4, two
// Limiters on one test clock: A takes a lease in window W and uses 1 of
// it; in W+1, B drains the window's 10, and A's next call gives its 3 old
// tokens to W+1, which then admits 13. Without leases W+1 would admit 10,
// so the lease makes the limit admit more.
func TestLeaseWindowEndCreditsTheNextWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "window")
	clk := storetest.NewClock()
	start := storetest.T0.Truncate(time.Hour)
	cfg := map[string]txlimit.Config{name: {Kind: txlimit.FixedWindow, Rate: 10, Period: time.Hour, Start: start,
		Lease: 4, LeaseFor: 2 * time.Hour}}
	pool := testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 4)
	newLimiter := func() *txlimit.Limiter[pgx.Tx] {
		l, err := txlimit.New(pgstore.New(pool), cfg, &txlimit.Options{Clock: clk.Now})
		require.NoError(t, err)
		return l
	}
	a, b := newLimiter(), newLimiter()
	drain := func(l *txlimit.Limiter[pgx.Tx], who string) int {
		n := 0
		for {
			_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, who) }, leaseReq(name))
			if errors.Is(err, txlimit.ErrRateLimited) {
				return n
			}
			require.NoError(t, err)
			n++
			require.LessOrEqual(t, n, 20)
		}
	}

	// Window W: A takes a lease of 4 and hands out 1.
	_, err := a.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "W") }, leaseReq(name))
	require.NoError(t, err)
	require.Equal(t, float64(3), snapshot(t, a, name).Leased)

	// Window W+1: B first, then A.
	clk.Advance(start.Add(time.Hour).Sub(clk.Now()))
	gotB := drain(b, "W+1")
	gotA := drain(a, "W+1")
	require.NoError(t, a.ReturnLeases(ctx))
	require.NoError(t, b.ReturnLeases(ctx))
	gotB += drain(b, "W+1")
	gotA += drain(a, "W+1")
	t.Logf("window W+1 admitted B %d, A %d", gotB, gotA)
	require.Equal(t, 10, gotB, "B gets the whole window")
	require.LessOrEqual(t, e.rows(t, "W+1"), 10, "a window admits at most its Rate (Capacity 10: no rollover)")
}

// leaseTally counts the outcomes of leaseTally.call.
type leaseTally struct {
	grants, failures, denials atomic.Int64
	seq                       atomic.Int64
}

// call is one Commit of l on name's key whose work inserts a business
// row and, every third call of the tally, then fails (rolled back: the
// token goes back to its lease, or to the limit once that lease has
// ended). It counts the outcome; denied says the limit denied the call,
// and ok is false after an unexpected error, which fails t.
func (c *leaseTally) call(ctx context.Context, t *testing.T, l *txlimit.Limiter[pgx.Tx], name string) (denied, ok bool) {
	fail := c.seq.Add(1)%3 == 0
	_, err := l.Commit(ctx, func(tx pgx.Tx) error {
		if err := insert(ctx, tx, "w"); err != nil {
			return err
		}
		if fail {
			return errFailed
		}
		return nil
	}, leaseReq(name))
	switch {
	case err == nil:
		c.grants.Add(1)
	case errors.Is(err, errFailed):
		c.failures.Add(1)
	case errors.Is(err, txlimit.ErrRateLimited):
		c.denials.Add(1)
		return true, true
	default:
		t.Errorf("unexpected error: %v", err)
		return false, false
	}
	return false, true
}
