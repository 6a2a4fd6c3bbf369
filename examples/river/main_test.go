package main

// These tests run the example against a real PostgreSQL: TEST_DATABASE_URL,
// else the local test server. Each test gets a schema of its own, created by
// Setup and dropped by Close.

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// testDatabaseURL returns the server to test against. Without one the tests
// skip, loudly, except under CI=true, where they fail.
func testDatabaseURL(t *testing.T) string {
	t.Helper()
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		err = conn.Ping(ctx)
		_ = conn.Close(ctx)
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING the River example's tests: no PostgreSQL at %s: %v (set TEST_DATABASE_URL or start a local server)", url, err)
	}
	return url
}

func setupApp(t *testing.T, clock func() time.Time) *App {
	t.Helper()
	app, err := Setup(context.Background(), testDatabaseURL(t), clock)
	require.NoError(t, err)
	t.Cleanup(func() { app.Close(context.Background()) })
	return app
}

// frozen is a limiter clock that stays at one instant: the limit never
// refills, so every count and RetryAfter is exact.
func frozen(at time.Time) func() time.Time {
	at = at.Truncate(time.Microsecond)
	return func() time.Time { return at }
}

// limitRows returns user's stored limit rows as text, with their ctid, which
// changes whenever a row is written, even with the same values.
func limitRows(t *testing.T, app *App, user string) []string {
	t.Helper()
	rows, err := app.Pool.Query(context.Background(),
		`SELECT format('%s %s %s %s', ctid, shard, value, ts) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
		emailLimit, user)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func count(t *testing.T, app *App, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, app.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

func jobsOf(t *testing.T, app *App, user string) int {
	return count(t, app, `SELECT count(*) FROM river_job WHERE args->>'user' = $1`, user)
}

func value(t *testing.T, app *App, user string) float64 {
	t.Helper()
	read, err := app.Limiter.Check(context.Background(), emailLimit, user)
	require.NoError(t, err)
	return read.Remaining
}

// reserved reports whether res reserved its tokens: granted, with a wait.
func reserved(res txlimit.Result) bool { return res.OK && res.RetryAfter > 0 }

// aheadLimit is how many emails one user may have accepted at once: the
// burst plus the reservations.
func aheadLimit(t *testing.T, app *App) int {
	cfg, ok := app.Limiter.Config(emailLimit)
	require.True(t, ok)
	return int(cfg.Capacity + cfg.MaxReserved)
}

// TestDemo runs the program's demo on the database clock and checks what it
// left in the database before the schema is dropped.
func TestDemo(t *testing.T) {
	ctx := context.Background()
	app := setupApp(t, nil)
	var out bytes.Buffer
	r, err := app.Demo(ctx, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)

	// alice's burst and reservations, and bob's one email; not alice's
	// refused 7th nor bob's rolled-back retry.
	ahead := aheadLimit(t, app)
	require.Equal(t, ahead, 6)
	require.Equal(t, ahead+1, count(t, app, `SELECT count(*) FROM river_job`))
	require.Len(t, r.Sent, ahead+1)
	require.Equal(t, ahead, jobsOf(t, app, "alice"))
	require.Equal(t, 1, jobsOf(t, app, "bob"))
	require.Len(t, r.Denied, 1)
	require.Zero(t, count(t, app, `SELECT count(*) FROM river_job WHERE args->>'subject' = 'alice #7'`))
	require.Zero(t, count(t, app, `SELECT count(*) FROM emails WHERE idempotency_key = 'alice-7'`))

	// One job cancelled before it ran, every other one completed.
	require.Equal(t, 1, count(t, app, `SELECT count(*) FROM river_job WHERE state = 'cancelled'`))
	require.Equal(t, ahead, count(t, app, `SELECT count(*) FROM river_job WHERE state = 'completed'`))
	require.Equal(t, 1, count(t, app,
		`SELECT count(*) FROM emails WHERE job_id = $1 AND cancelled_at IS NOT NULL AND sent_at IS NULL`, r.Cancelled[0]))

	// No job ran before its time: neither by River's own record nor by
	// the worker's.
	require.Equal(t, ahead, count(t, app, `SELECT count(*) FROM river_job AS j JOIN emails AS e ON e.job_id = j.id
		WHERE j.state = 'completed' AND e.sent_at >= e.run_after AND j.attempted_at >= j.scheduled_at`))

	// Reserved jobs are scheduled exactly for At + RetryAfter, and stacked
	// reservations of one user are one token apart (to the microsecond the
	// limiter rounds up to).
	var dues []time.Time
	for _, s := range r.Sent {
		job, err := app.River.JobGet(ctx, s.JobID)
		require.NoError(t, err)
		if !reserved(s.Result) {
			continue
		}
		require.True(t, s.RunAfter.Equal(job.ScheduledAt), "job %d: scheduled %v, reserved for %v", s.JobID, job.ScheduledAt, s.RunAfter)
		dues = append(dues, s.RunAfter)
	}
	require.Len(t, dues, 4)
	for i := 1; i < len(dues); i++ {
		require.InDelta(t, time.Second, dues[i].Sub(dues[i-1]), float64(2*time.Microsecond))
	}
}

// A failure after the reservation and the job insert rolls back both.
func TestRollbackLeavesNeitherJobNorSpentTokens(t *testing.T) {
	ctx := context.Background()
	app := setupApp(t, frozen(time.Now().Add(time.Hour)))
	s, err := app.SendEmail(ctx, "bob", "hello", "bob-1")
	require.NoError(t, err)
	require.False(t, reserved(s.Result))
	s, err = app.SendEmail(ctx, "bob", "again", "bob-2")
	require.NoError(t, err)
	require.False(t, reserved(s.Result))
	require.Zero(t, value(t, app, "bob"))
	before := limitRows(t, app, "bob")

	// The retry of bob-1 finds no token left: it reserves one and inserts
	// a scheduled job, then fails on the idempotency key.
	_, err = app.SendEmail(ctx, "bob", "hello", "bob-1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)

	require.Equal(t, before, limitRows(t, app, "bob"), "the reservation was rolled back")
	require.Zero(t, value(t, app, "bob"))
	require.Equal(t, 2, jobsOf(t, app, "bob"), "the job was rolled back")
	require.Zero(t, count(t, app, `SELECT count(*) FROM river_job WHERE state = 'scheduled'`))

	// The next reservation gets the slot the rolled-back one had.
	s, err = app.SendEmail(ctx, "bob", "third", "bob-3")
	require.NoError(t, err)
	require.Equal(t, time.Second, s.Result.RetryAfter)
}

// Concurrent requests of one user: exactly Capacity+MaxReserved are
// accepted, each with its own slot, and a refused one enqueues nothing.
func TestDeniedRequestInsertsNoJob(t *testing.T) {
	ctx := context.Background()
	app := setupApp(t, frozen(time.Now().Add(time.Hour)))
	const requests = 10
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		waits  []time.Duration
		denied []time.Duration
	)
	for i := range requests {
		wg.Go(func() {
			s, err := app.SendEmail(ctx, "alice", "hi", "alice-"+string(rune('a'+i)))
			mu.Lock()
			defer mu.Unlock()
			if rl, ok := errors.AsType[*txlimit.RateLimitedError](err); ok {
				denied = append(denied, rl.RetryAfter)
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			waits = append(waits, s.Result.RetryAfter)
		})
	}
	wg.Wait()
	ahead := aheadLimit(t, app)
	slices.Sort(waits)
	require.Equal(t, []time.Duration{0, 0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second}, waits)
	require.Len(t, denied, requests-ahead)
	for _, d := range denied {
		require.Equal(t, time.Second, d, "until the debt is back within MaxReserved")
	}
	require.Equal(t, ahead, jobsOf(t, app, "alice"))
	require.Equal(t, ahead, count(t, app, `SELECT count(*) FROM emails`))

	// One more, alone: refused, and nothing is written at all.
	before := limitRows(t, app, "alice")
	_, err := app.SendEmail(ctx, "alice", "hi", "alice-late")
	require.ErrorIs(t, err, txlimit.ErrRateLimited)
	require.Equal(t, before, limitRows(t, app, "alice"))
	require.Equal(t, ahead, jobsOf(t, app, "alice"))
}

// Cancelling a job that has not run gives its token back; cancelling one
// that ran, or cancelling twice, gives nothing.
func TestCancelCreditsTokens(t *testing.T) {
	ctx := context.Background()
	// The limiter's clock is an hour ahead of the database's, so reserved
	// jobs are scheduled an hour from now and stay put, while jobs granted
	// at once run now.
	app := setupApp(t, frozen(time.Now().Add(time.Hour)))
	completed, unsubscribe := app.River.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	require.NoError(t, app.River.Start(ctx))

	var sent []Sent
	for i := range 3 {
		s, err := app.SendEmail(ctx, "alice", "hi", "alice-"+string(rune('a'+i)))
		require.NoError(t, err)
		sent = append(sent, s)
	}
	require.True(t, reserved(sent[2].Result))
	require.Equal(t, -1.0, value(t, app, "alice"))

	// The reserved job has not run: cancelled, and its token is back.
	credited, err := app.CancelEmail(ctx, sent[2].JobID)
	require.NoError(t, err)
	require.True(t, credited)
	require.Zero(t, value(t, app, "alice"))
	job, err := app.River.JobGet(ctx, sent[2].JobID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCancelled, job.State)

	// Twice is refused, and credits nothing.
	_, err = app.CancelEmail(ctx, sent[2].JobID)
	require.ErrorIs(t, err, ErrAlreadyCancelled)
	require.Zero(t, value(t, app, "alice"))

	// A job that already ran keeps its token.
	waitCompleted(t, completed, sent[0].JobID, sent[1].JobID)
	credited, err = app.CancelEmail(ctx, sent[0].JobID)
	require.NoError(t, err)
	require.False(t, credited)
	require.Zero(t, value(t, app, "alice"))
	job, err = app.River.JobGet(ctx, sent[0].JobID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCompleted, job.State)

	// The next reservation takes the freed slot: one token ahead, not two.
	s, err := app.SendEmail(ctx, "alice", "hi", "alice-d")
	require.NoError(t, err)
	require.Equal(t, time.Second, s.Result.RetryAfter)
}

// The worker runs a reserved job when it is due even though the limit, on
// a clock that never moves, still has no token: it does not check again.
func TestWorkerDoesNotCheckTheLimit(t *testing.T) {
	ctx := context.Background()
	app := setupApp(t, frozen(time.Now()))
	completed, unsubscribe := app.River.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	require.NoError(t, app.River.Start(ctx))
	var ids []int64
	for i := range 3 {
		s, err := app.SendEmail(ctx, "alice", "hi", "alice-"+string(rune('a'+i)))
		require.NoError(t, err)
		ids = append(ids, s.JobID)
	}
	waitCompleted(t, completed, ids...)
	require.Equal(t, -1.0, value(t, app, "alice"), "the frozen limit has not refilled")
	require.Equal(t, 3, count(t, app, `SELECT count(*) FROM emails WHERE sent_at >= run_after`))
}

// waitCompleted waits for River to report every job of ids completed.
func waitCompleted(t *testing.T, events <-chan *river.Event, ids ...int64) {
	t.Helper()
	pending := map[int64]bool{}
	for _, id := range ids {
		pending[id] = true
	}
	timeout := time.After(time.Minute)
	for len(pending) > 0 {
		select {
		case ev := <-events:
			delete(pending, ev.Job.ID)
		case <-timeout:
			t.Fatalf("jobs %v did not complete within a minute", pending)
		}
	}
}
