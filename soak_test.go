package txlimit_test

// A soak test: mixed limits (both kinds, sharded, reserving), business
// writes, random rollbacks and, on PostgreSQL, connections killed under load,
// for a bounded time. At the end the committed business rows per limit must
// equal exactly what the limits allow: the tokens spent are the tokens the
// committed transactions took, nothing lost and nothing invented.
//
// TXLIMIT_SOAK_PHASE sets the length of each of the four phases: 500ms by
// default, for a quick go test ./...; .ci/run sets 2s, and
// TXLIMIT_SOAK_PHASE=30s soaks for two minutes. (At 1s a phase, with the
// workers spinning on denials, the two soaks were a tenth of the root
// package's CPU.)

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

const soakPhases = 4

func soakPhase(t *testing.T) time.Duration {
	if v := os.Getenv("TXLIMIT_SOAK_PHASE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		return d
	}
	return 500 * time.Millisecond
}

type soakLimit struct {
	name    string
	cfg     txlimit.Config
	reserve bool
	// want is the number of admissions over soakPhases phases with the
	// clock frozen in each phase and moved one Period between phases,
	// when demand exceeds supply.
	want int
}

func soakLimits(t *testing.T) []soakLimit {
	start := storetest.T0.Add(-time.Minute) // fixed windows aligned to the phases
	ls := []soakLimit{
		{name: "tb", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 30, Period: time.Hour}},
		{name: "tb-shards", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 40, Period: time.Hour, Shards: 8}},
		{name: "fw", cfg: txlimit.Config{Kind: txlimit.FixedWindow, Rate: 25, Period: time.Hour, Start: start}},
		{name: "fw-shards", cfg: txlimit.Config{Kind: txlimit.FixedWindow, Rate: 32, Period: time.Hour, Start: start, Shards: 4}},
		{name: "reserve", cfg: txlimit.Config{Kind: txlimit.TokenBucket, Rate: 20, Period: time.Hour, MaxReserved: 10}, reserve: true},
	}
	for i := range ls {
		ls[i].name = storetest.UniqueName(t, ls[i].name)
		ls[i].want = int(ls[i].cfg.Rate)*soakPhases + int(ls[i].cfg.MaxReserved)
	}
	return ls
}

// soakStore is what the soak needs from a database beyond the limiter.
type soakStore[TTx any] struct {
	h storetest.Harness[TTx]
	// begin opens a transaction; unlike h.Begin it returns its error, for
	// the workers' goroutines (which must not end the test) and for
	// connections killed under them.
	begin func(ctx context.Context) (TTx, error)
	// insert writes the business row in tx.
	insert func(ctx context.Context, tx TTx, limit string) error
	// count returns the committed business rows of limit.
	count func(t *testing.T, limit string) int
	// kill, when set, terminates a random connection of the workers' pool.
	kill func(ctx context.Context) error
	// retryable classifies the errors a worker may see.
	retryable func(error) bool
}

func runSoak[TTx any](t *testing.T, s soakStore[TTx], workers int) {
	ctx := context.Background()
	clk := storetest.NewClock()
	limits := soakLimits(t)
	cfgs := map[string]txlimit.Config{}
	for _, sl := range limits {
		cfgs[sl.name] = sl.cfg
	}
	l, err := txlimit.New(s.h.Store, cfgs, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)

	var committed, rolledBack, denied, failed atomic.Int64
	work := func(rng *rand.Rand) {
		sl := limits[rng.IntN(len(limits))]
		tx, err := s.begin(ctx)
		if err != nil {
			if !s.retryable(err) {
				t.Errorf("unexpected begin error: %v", err)
			}
			failed.Add(1)
			return
		}
		var opts []txlimit.Option
		if sl.reserve {
			opts = append(opts, txlimit.Reserve())
		}
		res, err := l.LimitTx(ctx, tx, sl.name, "", opts...)
		if err == nil && res.OK {
			err = s.insert(ctx, tx, sl.name)
		}
		switch {
		case err != nil:
			s.h.Rollback(tx)
			if !s.retryable(err) {
				t.Errorf("unexpected error: %v", err)
			}
			failed.Add(1)
		case !res.OK:
			s.h.Rollback(tx)
			denied.Add(1)
			// Once the limits are drained, a phase is all denials: a caller
			// pauses after one, as a client would, instead of spinning (on
			// SQLite, 40,000 denials a second and most of the soak's CPU).
			time.Sleep(time.Millisecond)
		case rng.IntN(4) == 0:
			s.h.Rollback(tx) // the business transaction fails after LimitTx
			rolledBack.Add(1)
		default:
			if err := s.h.Commit(tx); err != nil {
				// A COMMIT that failed on a killed connection may or may not
				// have happened; the business rows tell, at the end.
				if !s.retryable(err) {
					t.Errorf("unexpected commit error: %v", err)
				}
				failed.Add(1)
				return
			}
			committed.Add(1)
		}
	}

	// value reads the tokens left in a limit.
	value := func(sl soakLimit) float64 {
		for {
			tx, err := s.begin(ctx)
			if err == nil {
				var res txlimit.Result
				res, err = l.CheckTx(ctx, tx, sl.name, "", txlimit.Count(0))
				s.h.Rollback(tx)
				if err == nil {
					return res.Remaining
				}
			}
			require.True(t, s.retryable(err), "value: %v", err)
		}
	}
	drained := func() bool {
		for _, sl := range limits {
			if value(sl) > -sl.cfg.MaxReserved+1e-6 {
				return false
			}
		}
		return true
	}

	// Each phase runs for at least soakPhase and until every limit is
	// drained, so that the expected totals hold whatever the machine's speed;
	// a limit that never drains (a wrong denial) fails the test.
	for phase := range soakPhases {
		if phase > 0 {
			clk.Advance(time.Hour)
		}
		var stop, stopKilling atomic.Bool
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(phase), uint64(w)))
				for !stop.Load() {
					work(rng)
				}
			}()
		}
		if s.kill != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stopKilling.Load() {
					if err := s.kill(ctx); err != nil {
						t.Errorf("kill: %v", err)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
		}
		time.Sleep(soakPhase(t))
		// The killer stops first: on a loaded machine, kills every 50 ms can
		// abort nearly every transaction, and the test is about wrong
		// denials, not about the speed of work under fire.
		stopKilling.Store(true)
		giveUp := time.Now().Add(3 * time.Minute)
		for !drained() && time.Now().Before(giveUp) {
			time.Sleep(20 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		require.True(t, drained(), "phase %d: the limits were not drained within 3 minutes of the last kill", phase)
	}

	t.Logf("committed %d, rolled back %d, denied %d, failed %d", committed.Load(), rolledBack.Load(), denied.Load(), failed.Load())
	for _, sl := range limits {
		require.Equal(t, sl.want, s.count(t, sl.name), "business rows of %s", sl.name)
		require.InDelta(t, -sl.cfg.MaxReserved, value(sl), 1e-6, "tokens left in %s", sl.name)
	}
}

func TestSoakPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	// The workers' connections carry an application_name of their own, so
	// that the killer picks its victims among them only.
	workersApp := "txlimit-soak-" + schema
	pool := testdb.PoolParams(t, schema, pgx.QueryExecModeCacheStatement, 8, map[string]string{"application_name": workersApp})
	admin := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	_, err := admin.Exec(ctx, `CREATE TABLE soak_events (id bigserial PRIMARY KEY, limit_name text NOT NULL)`)
	require.NoError(t, err)
	runSoak(t, soakStore[pgx.Tx]{
		h:     testdb.PgxHarness(pool, pgstore.New(pool)),
		begin: func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
		insert: func(ctx context.Context, tx pgx.Tx, limit string) error {
			_, err := tx.Exec(ctx, `INSERT INTO soak_events (limit_name) VALUES ($1)`, limit)
			return err
		},
		count: func(t *testing.T, limit string) int {
			var n int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM soak_events WHERE limit_name = $1`, limit).Scan(&n))
			return n
		},
		kill: func(ctx context.Context) error {
			_, err := admin.Exec(ctx, `
				SELECT pg_terminate_backend(pid) FROM (
					SELECT pid FROM pg_stat_activity WHERE application_name = $1
					ORDER BY random() LIMIT 1) AS victim`, workersApp)
			return err
		},
		retryable: func(err error) bool {
			return pgstore.Retryable(err) || errors.Is(err, pgx.ErrTxClosed)
		},
	}, 6)
}

func TestSoakSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Four writers in tight loops, beside the other parallel tests (and
	// under -race): SQLite's busy handler is not a queue, so on a loaded
	// machine one writer can wait for the lock longer than the documented
	// 10 s (SQLITE_BUSY at BEGIN, seen under -race). The soak is about
	// what is admitted, not about SQLite's fairness: it waits up to a
	// minute.
	require.Contains(t, testdb.SQLiteDSN, "busy_timeout(10000)")
	db := testdb.OpenSQLiteDSN(t, strings.Replace(testdb.SQLiteDSN, "busy_timeout(10000)", "busy_timeout(60000)", 1))
	_, err := db.Exec(`CREATE TABLE soak_events (id INTEGER PRIMARY KEY, limit_name TEXT NOT NULL)`)
	require.NoError(t, err)
	runSoak(t, soakStore[*sql.Tx]{
		h:     testdb.SQLiteHarness(db, sqlitestore.New(db)),
		begin: func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		insert: func(ctx context.Context, tx *sql.Tx, limit string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO soak_events (limit_name) VALUES (?)`, limit)
			return err
		},
		count: func(t *testing.T, limit string) int {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM soak_events WHERE limit_name = ?`, limit).Scan(&n))
			return n
		},
		retryable: func(err error) bool { return false },
	}, 4)
}
