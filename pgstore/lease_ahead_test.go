package pgstore_test

// Leases taken ahead (Config.LeaseAhead) on a real PostgreSQL: many
// callers of one hot key through one Limiter, with an exact ledger; a
// token given back to the slice it came from, or to the limit once that
// slice has ended; and a take ahead in flight, held on the limit's row
// lock by a transaction of the test's, when a call finds the lease empty
// and when ReturnLeases runs.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// aheadLimit is a fixed window of capacity whose window holds the frozen
// clock, leased 8 at a time, the next lease taken when one is down to 4.
func aheadLimit(capacity float64, frozen time.Time) txlimit.Config {
	return txlimit.Config{Kind: txlimit.FixedWindow, Rate: capacity, Period: time.Hour,
		Start: frozen.Add(-time.Minute), Lease: 8, LeaseAhead: 4}
}

// TestLeaseAheadHotKeyExact: 32 goroutines, each on a connection of its
// own, call Commit on one key through one Limiter; a third of the
// calls' work fails after its insert (rolled back: the token goes back).
// First 12 calls each, fewer than the capacity: every grant has its
// business row, and the limit's value with the tokens parked adds up to the
// capacity less the grants, which is the value once ReturnLeases has
// given them back. Then every goroutine calls until denied: exactly the
// capacity is admitted, none lost to the leases.
func TestLeaseAheadHotKeyExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capacity, goroutines, calls = 600, 32, 12
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "hot")
	frozen := storetest.T0
	cfg := aheadLimit(capacity, frozen)
	l, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, goroutines+1)),
		map[string]txlimit.Config{name: cfg}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.ReturnLeases(ctx)) })

	var tally leaseTally
	grants, failures, denials := &tally.grants, &tally.failures, &tally.denials
	// round runs the goroutines, each making calls calls, or calling until
	// denied when calls is 0.
	round := func(calls int) {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for i := 0; calls == 0 || i < calls; i++ {
					if denied, ok := tally.call(ctx, t, l, name); denied || !ok {
						return
					}
				}
			})
		}
		wg.Wait()
		require.False(t, t.Failed())
	}

	round(calls)
	require.Zero(t, denials.Load(), "the first round asks for less than the capacity")
	g := int(grants.Load())
	require.Equal(t, goroutines*calls, g+int(failures.Load()))
	require.Equal(t, g, e.rows(t, ""), "a business row per grant, none of a failed call")
	// Check waits for a take ahead still in flight.
	s := snapshot(t, l, name)
	require.Equal(t, float64(capacity-g), s.Remaining+s.Leased, "value + leased is the capacity less the grants")
	require.LessOrEqual(t, s.Leased, 2*cfg.Lease,
		"a lease held and one taken ahead: at most Lease each, counting the tokens failed calls gave back")
	require.NoError(t, l.ReturnLeases(ctx))
	s = snapshot(t, l, name)
	require.Zero(t, s.Leased)
	require.Equal(t, float64(capacity-g), s.Remaining, "ReturnLeases gave back every token not granted")

	round(0)
	require.Equal(t, int64(goroutines), denials.Load(), "every goroutine called until denied")
	require.Equal(t, int64(capacity), grants.Load(), "exactly the capacity admitted")
	require.Equal(t, capacity, e.rows(t, ""))
	require.NoError(t, l.ReturnLeases(ctx))
	s = snapshot(t, l, name)
	require.Zero(t, s.Remaining+s.Leased)
	t.Logf("%d grants, %d failures", grants.Load(), failures.Load())
}

// TestLeaseAheadGivesBackToItsSlice: a failed call's token goes back to
// the slice it was handed out from while that slice is the one held, and
// to the limit once the slice taken ahead has replaced it (capacity 20,
// Lease 4, LeaseAhead 2).
func TestLeaseAheadGivesBackToItsSlice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "slices")
	frozen := storetest.T0
	cfg := aheadLimit(20, frozen)
	cfg.Lease, cfg.LeaseAhead = 4, 2
	l, err := txlimit.New(pgstore.New(testdb.Pool(t, e.schema, pgx.QueryExecModeCacheStatement, 8)),
		map[string]txlimit.Config{name: cfg}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.ReturnLeases(ctx)) })
	call := func() {
		t.Helper()
		_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "w") }, leaseReq(name))
		require.NoError(t, err)
	}
	state := func(value, leased float64, what string) {
		t.Helper()
		s := snapshot(t, l, name)
		require.Equal(t, value, s.Remaining, "value: %s", what)
		require.Equal(t, leased, s.Leased, "leased: %s", what)
	}

	releaseA, doneA := stall(t, l, name, "A", errFailed)
	state(16, 3, "the first slice took 4; A holds one")
	call()
	call()
	state(12, 5, "down to 1 < LeaseAhead: the next slice is taken ahead (Check waits for it)")
	releaseC, doneC := stall(t, l, name, "C", nil)
	state(12, 4, "C holds the first slice's last token")
	call()
	state(12, 3, "the first slice is spent: the one taken ahead serves")

	releaseA()
	require.ErrorIs(t, <-doneA, errFailed)
	state(13, 3, "A's token goes back to the limit: its slice has ended")
	releaseD, doneD := stall(t, l, name, "D", errFailed)
	state(13, 2, "D holds a token of the second slice")
	releaseD()
	require.ErrorIs(t, <-doneD, errFailed)
	state(13, 3, "D's token goes back to the second slice, still held")
	releaseC()
	require.NoError(t, <-doneC, "C commits with a token of a slice that has ended")

	require.Equal(t, 4, e.rows(t, ""), "three calls and C")
	require.NoError(t, l.ReturnLeases(ctx))
	state(16, 0, "20 less the 4 committed")
}

// TestLeaseAheadInFlight: a take ahead waits on the limit's row, which a
// transaction of the test's holds (capacity 20, Lease 4, LeaseAhead 2). A
// call that finds the lease held empty meanwhile waits for that take, not
// taking one of its own. ReturnLeases waits for it and gives its tokens
// back with the others. Then, with the row held again, ReturnLeases with a
// deadline cancels the take and returns only once it has ended; the
// Observer hears of the failed take ("lease_ahead"), and the tokens it
// would have taken were never taken.
func TestLeaseAheadInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLeaseEnv(t)
	name := storetest.UniqueName(t, "inflight")
	app := "txlimit_lease_ahead_" + e.schema[len("txlimit_test_"):]
	frozen := storetest.T0
	cfg := aheadLimit(20, frozen)
	cfg.Lease, cfg.LeaseAhead = 4, 2
	var mu sync.Mutex
	var aheadErrs []error
	obs := storetest.ObserverFunc(func(_ context.Context, ev txlimit.Event) {
		if ev.Op == "lease_ahead" {
			mu.Lock()
			defer mu.Unlock()
			aheadErrs = append(aheadErrs, ev.Err)
		}
	})
	pool := testdb.PoolParams(t, e.schema, pgx.QueryExecModeCacheStatement, 4, map[string]string{"application_name": app})
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{name: cfg},
		&txlimit.Options{Clock: func() time.Time { return frozen }, Observer: obs})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.ReturnLeases(ctx)) })
	begin := func() error {
		_, err := l.Commit(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, "w") }, leaseReq(name))
		return err
	}
	call := func() {
		t.Helper()
		require.NoError(t, begin())
	}
	state := func(value, leased float64, what string) {
		t.Helper()
		s := snapshot(t, l, name)
		require.Equal(t, value, s.Remaining, "value: %s", what)
		require.Equal(t, leased, s.Leased, "leased: %s", what)
	}
	// holdRow locks the limit's row until the returned rollback.
	holdRow := func() (rollback func()) {
		t.Helper()
		tx, err := e.admin.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM txlimit WHERE name = $1 AND key = 'k' FOR UPDATE`, name)
		require.NoError(t, err)
		var once sync.Once
		rollback = func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
		t.Cleanup(rollback)
		return rollback
	}
	waiting := func() int {
		t.Helper()
		var n int
		require.NoError(t, e.admin.QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n))
		return n
	}
	takeWaits := func() {
		t.Helper()
		require.Eventually(t, func() bool { return waiting() == 1 }, 10*time.Second, time.Millisecond,
			"the take ahead waits for the row")
	}

	call() // a lease of 4 (20 → 16), 3 left
	release := holdRow()
	call()
	call() // 1 left < LeaseAhead: the take ahead starts, and waits
	takeWaits()
	call() // the last token of the lease held
	called := make(chan error, 1)
	go func() { called <- begin() }()
	select {
	case err := <-called:
		t.Fatalf("a call on the empty lease returned while the take ahead was in flight: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.Equal(t, 1, waiting(), "the call waits for the take ahead, not on the row: it took no lease of its own")
	release()
	require.NoError(t, <-called)
	state(12, 3, "the call was served from the lease taken ahead")

	release = holdRow()
	call()
	call() // 1 left: a take ahead, waiting
	takeWaits()
	returned := make(chan error, 1)
	go func() { returned <- l.ReturnLeases(ctx) }()
	select {
	case err := <-returned:
		t.Fatalf("ReturnLeases returned while the take ahead was in flight: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	require.NoError(t, <-returned)
	state(13, 0, "the lease held and the one taken ahead both came back: 20 less 7 granted")

	call() // a lease of 4 (13 → 9), 3 left
	release = holdRow()
	call()
	call() // 1 left: a take ahead, waiting
	takeWaits()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, l.ReturnLeases(short), context.DeadlineExceeded)
	mu.Lock()
	require.Len(t, aheadErrs, 1, "the cancelled take reached the Observer before ReturnLeases returned")
	require.Error(t, aheadErrs[0])
	mu.Unlock()
	state(9, 1, "the lease held is left as it was")
	release()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, e.admin.QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'`, app).Scan(&n))
		return n == 0
	}, 10*time.Second, time.Millisecond, "the cancelled take's backend has finished")
	state(9, 1, "the cancelled take took nothing")
	require.NoError(t, l.ReturnLeases(ctx))
	state(10, 0, "20 less the 10 granted")
	require.Equal(t, 10, e.rows(t, ""))
}
