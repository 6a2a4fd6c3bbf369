// Package observertest is what the tests of txlimit's Observers share: a
// scenario of real calls whose every outcome is known, the counts it must
// produce, and the databases it runs on (a SQLite file in the test's temp
// dir; PostgreSQL through internal/testkit/testdb, which fails under CI=true when
// there is none), and a Recorder that keeps every Event.
package observertest

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the SQLite driver the tests open

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

// RunScenario makes real calls on a Limiter over store, observed by obs,
// whose outcomes are known exactly (the clock stands still): see
// WantDecisions and WantErrors. unmigrated is a store on a database without
// txlimit's table; unreachable is one on a closed database, for the store's
// errors. obs is an Observer such as otelobserver's and promobserver's,
// whose Observe method the Limiters are given as Options.Observer.
func RunScenario[TTx any](t *testing.T, store, unmigrated, unreachable driver.Store[TTx], obs Observer) {
	t.Helper()
	ctx := context.Background()
	opts := &txlimit.Options{Clock: Frozen(), Observer: obs.Observe}
	l, err := txlimit.New(store, map[string]txlimit.Config{
		"send":  {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour, MaxReserved: 1},
		"burst": {Kind: txlimit.FixedWindow, Rate: 10, Period: time.Hour, Shards: 2},
	}, opts)
	require.NoError(t, err)

	// send: 2 allowed, 1 reserved, then 2 denied (the reservation cap is
	// reached), then a Check that is denied.
	for i, want := range []string{"allowed", "allowed", "reserved", "denied"} {
		res, err := l.Limit(ctx, "send", "alice", txlimit.Reserve())
		require.NoError(t, err)
		got := "denied"
		switch {
		case res.OK && res.RetryAfter > 0:
			got = "reserved"
		case res.OK:
			got = "allowed"
		}
		require.Equal(t, want, got, "call %d", i)
	}
	res, err := l.Limit(ctx, "send", "alice")
	require.NoError(t, err)
	require.False(t, res.OK)
	res, err = l.Check(ctx, "send", "alice")
	require.NoError(t, err)
	require.False(t, res.OK)

	// Errors: bad input twice, a cancelled context.
	_, err = l.Limit(ctx, "send", "alice", txlimit.Count(-1))
	require.ErrorAs(t, err, new(*txlimit.InvalidError))
	_, err = l.Limit(ctx, "nope", "alice")
	storetest.RequireUnknownLimit(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.Limit(cancelled, "send", "bob")
	require.ErrorIs(t, err, context.Canceled)

	// A database without the table: an error even under FailOpen, which
	// never grants on a setup mistake.
	bare := map[string]txlimit.Config{"bare": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}
	for _, failOpen := range []bool{false, true} {
		l, err := txlimit.New(unmigrated, bare, &txlimit.Options{Observer: obs.Observe, FailOpen: failOpen})
		require.NoError(t, err)
		_, err = l.Limit(ctx, "bare", "")
		require.ErrorIs(t, err, txlimit.ErrNotMigrated)
	}
	// A database that cannot be reached: once failing closed, once open.
	down := map[string]txlimit.Config{"down": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}
	closed, err := txlimit.New(unreachable, down, &txlimit.Options{Observer: obs.Observe})
	require.NoError(t, err)
	_, err = closed.Limit(ctx, "down", "")
	require.Error(t, err)
	require.NotErrorIs(t, err, txlimit.ErrNotMigrated)
	open, err := txlimit.New(unreachable, down, &txlimit.Options{Observer: obs.Observe, FailOpen: true})
	require.NoError(t, err)
	res, err = open.Limit(ctx, "down", "")
	require.NoError(t, err)
	require.True(t, res.FailedOpen)

	// burst: 24 goroutines, each on a connection of its own, race for 10
	// tokens over 2 shards.
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for range 24 {
		wg.Go(func() {
			_, err := l.Limit(ctx, "burst", "")
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// WantDecisions is what RunScenario decides, by "limit op outcome".
var WantDecisions = map[string]int64{
	"send limit allowed":     2,
	"send limit reserved":    1,
	"send limit denied":      2,
	"send check denied":      1,
	"send limit error":       2, // Count(-1), cancelled
	"nope limit error":       1,
	"bare limit error":       2,
	"down limit error":       1,
	"down limit failed_open": 1,
	"burst limit allowed":    10,
	"burst limit denied":     14,
}

// WantErrors is RunScenario's errors, by "limit op kind".
var WantErrors = map[string]int64{
	"send limit invalid":      1,
	"send limit canceled":     1,
	"nope limit invalid":      1,
	"bare limit not_migrated": 2,
	"down limit database":     2,
}

// Frozen is a clock that stands still, so that no token refills during a
// test and every count is exact.
func Frozen() func() time.Time {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return func() time.Time { return at }
}

// SQLite opens a new SQLite file, with txlimit's table when migrate, closed
// when t ends.
func SQLite(t *testing.T, migrate bool) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "txlimit.db")+testdb.SQLiteDSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	if migrate {
		require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	}
	return db
}

// ClosedSQLite returns a migrated database that is already closed.
func ClosedSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db := SQLite(t, true)
	require.NoError(t, db.Close())
	return db
}

// Postgres returns a pool of at most 8 connections whose search_path is a
// new schema, dropped when t ends, with txlimit's table when migrate.
func Postgres(t *testing.T, migrate bool) *pgxpool.Pool {
	t.Helper()
	schema := testdb.EmptySchema(t)
	if migrate {
		schema = testdb.Schema(t)
	}
	return testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8)
}

// ClosedPostgres returns a pool on a migrated schema that is already closed.
func ClosedPostgres(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := Postgres(t, true)
	pool.Close()
	return pool
}

// Observer is what RunScenario observes with: a value whose Observe is
// passed as txlimit.Options.Observer.
type Observer interface {
	Observe(ctx context.Context, e txlimit.Event)
}

// Recorder is an Observer that keeps every Event: pass its Observe as
// txlimit.Options.Observer.
type Recorder struct {
	mu     sync.Mutex
	events []txlimit.Event
}

// Observe keeps e.
func (r *Recorder) Observe(_ context.Context, e txlimit.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Take returns the events kept since the last Take, in order, and forgets
// them.
func (r *Recorder) Take() []txlimit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}
