package txlimit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/observertest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

func TestObserverSeesEveryDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.OpenSQLite(t)
	rec := &observertest.Recorder{}
	clk := storetest.NewClock()
	name := storetest.UniqueName(t, "observed")
	l, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute, MaxReserved: 1},
	}, &txlimit.Options{Clock: clk.Now, Observer: rec.Observe})
	require.NoError(t, err)

	_, err = l.Limit(ctx, name, "k")
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, tx, name, "k")
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Reserve())
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, tx, name, "k", txlimit.Reserve())
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	_, err = l.Check(ctx, name, "k")
	require.NoError(t, err)
	_, err = l.Limit(ctx, name, "k", txlimit.Count(-1))
	require.ErrorAs(t, err, new(*txlimit.InvalidError))
	multi, err := l.LimitAll(ctx, txlimit.Request{Name: name, Key: "a"}, txlimit.Request{Name: name, Key: "k", Options: []txlimit.Option{txlimit.Count(2)}})
	require.NoError(t, err)
	require.False(t, multi.OK)

	var got []string
	for _, e := range rec.Take() {
		got = append(got, fmt.Sprintf("%s %s %s %v", e.Op, e.Key, e.Outcome, e.Count))
		require.GreaterOrEqual(t, e.Duration, e.LockWait)
		if e.Err == nil {
			require.Equal(t, e.Name, e.Result.Name)
		}
	}
	require.Equal(t, []string{
		"limit k allowed 1",
		"limit k allowed 1",
		"limit k reserved 1",
		"limit k denied 1", // MaxReserved 1 is used up
		"check k denied 1",
		"limit k error -1",
		// k has no tokens, so a, which has, takes nothing either.
		"limit_all a denied 1",
		"limit_all k denied 2",
	}, got)
}

func TestFailOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	name := storetest.UniqueName(t, "failopen")
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour}}
	closed := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	closed.Close()

	// By default a store failure is an error (fail closed).
	strict, err := txlimit.New(pgstore.New(closed), limits, nil)
	require.NoError(t, err)
	_, err = strict.Limit(ctx, name, "k")
	require.Error(t, err)

	rec := &observertest.Recorder{}
	open, err := txlimit.New(pgstore.New(closed), limits, &txlimit.Options{FailOpen: true, Observer: rec.Observe})
	require.NoError(t, err)
	res, err := open.Limit(ctx, name, "k", txlimit.Count(0.5))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.True(t, res.FailedOpen)
	require.Equal(t, 0.5, res.Count)
	require.NoError(t, res.Err())
	res, err = open.Check(ctx, name, "k")
	require.NoError(t, err)
	require.True(t, res.FailedOpen)
	multi, err := open.LimitAll(ctx, txlimit.Request{Name: name, Key: "a"}, txlimit.Request{Name: name, Key: "b"})
	require.NoError(t, err)
	require.True(t, multi.OK)
	require.True(t, multi.Results[1].FailedOpen)

	events := rec.Take()
	require.Len(t, events, 4)
	for _, e := range events {
		require.Equal(t, "failed_open", e.Outcome)
		require.Error(t, e.Err, "the observer gets the error that was swallowed")
	}

	// Bad input, a cancelled context and the Tx forms are never failed open.
	_, err = open.Limit(ctx, name, "k", txlimit.Count(2))
	require.ErrorAs(t, err, new(*txlimit.InvalidError))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = open.Limit(cctx, name, "k")
	require.ErrorIs(t, err, context.Canceled)
	noPool, err := txlimit.New(pgstore.New(nil), limits, &txlimit.Options{FailOpen: true, Observer: rec.Observe})
	require.NoError(t, err)
	rec.Take()
	_, err = noPool.Limit(ctx, name, "k")
	storetest.RequireNoPool(t, err)
	events = rec.Take()
	require.Len(t, events, 1)
	require.Equal(t, "error", events[0].Outcome)
	require.Equal(t, "invalid", events[0].ErrorKind, "a store without a pool is bad input")

	live := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	tx, err := live.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "DROP TABLE txlimit") // the store fails inside the caller's transaction
	require.NoError(t, err)
	_, err = open.LimitTx(ctx, tx, name, "k")
	require.Error(t, err)
	require.NoError(t, tx.Rollback(ctx))
}

// BenchmarkObserver measures what an Observer costs per call, against no
// Observer, on the same SQLite database in the same run:
//
//	go test -run '^$' -bench Observer -benchtime 2s .
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	// synchronous(OFF): no fsync per commit, so that the limiter's own CPU
	// time is not lost in the disk's noise.
	db, err := sql.Open("sqlite", "file:"+b.TempDir()+"/bench.db"+testdb.SQLiteDSN+"&_pragma=synchronous(OFF)")
	require.NoError(b, err)
	defer db.Close()
	db.SetMaxOpenConns(1)
	require.NoError(b, migrations.Up(ctx, db, migrations.SQLite))
	limits := map[string]txlimit.Config{"bench": {Kind: txlimit.TokenBucket, Rate: 1e12, Period: time.Second}}
	count := 0
	for _, bc := range []struct {
		name string
		obs  func(context.Context, txlimit.Event)
	}{
		{"none", nil},
		{"counting", func(context.Context, txlimit.Event) { count++ }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := txlimit.New(sqlitestore.New(db), limits, &txlimit.Options{Observer: bc.obs})
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Limit(ctx, "bench", "k"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	if count == 0 {
		b.Fatal("the observer was never called")
	}
}

// Example_observer exports decisions as counters by limit and outcome, the
// shape of a Prometheus counter vector or an expvar.Map.
func Example_observer() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txlimit-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	counts := map[string]int{}
	observer := func(_ context.Context, e txlimit.Event) {
		mu.Lock()
		defer mu.Unlock()
		counts[e.Name+" "+e.Outcome]++
	}
	clock := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"login": {Kind: txlimit.FixedWindow, Rate: 3, Period: time.Minute, Start: clock},
	}, &txlimit.Options{Observer: observer, Clock: func() time.Time { return clock }})
	if err != nil {
		log.Fatal(err)
	}
	for range 5 {
		if _, err := limiter.Limit(ctx, "login", "alice"); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := limiter.Limit(ctx, "login", "alice", txlimit.Count(-1)); !errors.As(err, new(*txlimit.InvalidError)) {
		log.Fatal(err)
	}
	var lines []string
	for k, n := range counts {
		lines = append(lines, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// login allowed: 3
	// login denied: 2
	// login error: 1
}

func TestEventErrorKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&txlimit.InvalidError{Field: "Count"}, "invalid"},
		{fmt.Errorf("wrapped: %w", &txlimit.InvalidError{Field: "store"}), "invalid"}, // a store without a pool
		{fmt.Errorf("take: %w", txlimit.ErrNotMigrated), "not_migrated"},
		{fmt.Errorf("begin: %w", context.Canceled), "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{sql.ErrConnDone, "database"},
		{errors.New("SQLSTATE 40001"), "database"},
	} {
		require.Equal(t, c.want, txlimit.EventErrorKind(txlimit.Event{Err: c.err}), "%v", c.err)
	}
}
