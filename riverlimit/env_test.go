package riverlimit_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/riverlimit"
)

// The tests run a real River client on PostgreSQL as internal/testkit/testdb
// finds it (TEST_DATABASE_URL, the local server, a container), each in a
// schema of its own holding txlimit's tables and River's (rivermigrate).
// Without PostgreSQL they skip, except under CI=true, where they fail.

// The tests run 2 at a time (go test's default on the 2-core machines),
// not testdb.Main's 6: each runs River clients on a pool of its own, and the
// whole run stays well under PostgreSQL's max_connections of 100.

// env is a test's database: its schema, a pool on it, and a limiter whose
// Events it records.
type env struct {
	schema  string
	pool    *pgxpool.Pool
	limiter *txlimit.Limiter[pgx.Tx]
	events  *eventLog
}

// newEnv creates a schema with txlimit's and River's tables and a limiter
// with limits on it.
func newEnv(t *testing.T, limits map[string]txlimit.Config) *env {
	t.Helper()
	schema := testdb.Schema(t)
	return openEnv(t, schema, limits, nil)
}

// openEnv opens a pool and a limiter on schema, migrating River's tables
// into it unless a process of its own (the killed worker's) has them
// already; observe, when not nil, sees every Event too.
func openEnv(t *testing.T, schema string, limits map[string]txlimit.Config, observe func(txlimit.Event)) *env {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8)
	if observe == nil {
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
		require.NoError(t, err)
		_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		require.NoError(t, err)
	}
	e := &env{schema: schema, pool: pool, events: &eventLog{observe: observe}}
	var err error
	e.limiter, err = txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Observer: e.events.add})
	require.NoError(t, err)
	return e
}

// client returns a River client on e's schema with workers, the
// middleware (and others around it, outermost first), and fast fetches and
// retries, started unless workers is nil (an insert-only client), and
// stopped when t ends.
func (e *env) client(t *testing.T, workers *river.Workers, maxWorkers int, middleware ...rivertype.Middleware) *river.Client[pgx.Tx] {
	t.Helper()
	cfg := &river.Config{
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)), // panics are logged: the tests make some
		Schema:            e.schema,
		TestOnly:          true,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		RetryPolicy:       fastRetry{},
		Middleware:        middleware,
	}
	if workers != nil {
		cfg.Workers = workers
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}}
	}
	c, err := river.NewClient(riverpgxv5.New(e.pool), cfg)
	require.NoError(t, err)
	if workers != nil {
		require.NoError(t, c.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.StopAndCancel(ctx)
		})
	}
	return c
}

// fastRetry retries a failed job 20ms later, not River's seconds.
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(20 * time.Millisecond) }

// middleware returns the riverlimit middleware with cfg.
func (e *env) middleware(t *testing.T, cfg riverlimit.Config) *riverlimit.Middleware[pgx.Tx] {
	t.Helper()
	mw, err := riverlimit.New(e.limiter, cfg)
	require.NoError(t, err)
	return mw
}

// waitFinal waits until every job of ids is finalized (completed,
// discarded, cancelled) and returns them.
func (e *env) waitFinal(t *testing.T, c *river.Client[pgx.Tx], ids []int64, timeout time.Duration) []*rivertype.JobRow {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		jobs := make([]*rivertype.JobRow, len(ids))
		final := 0
		for i, id := range ids {
			job, err := c.JobGet(ctx, id)
			require.NoError(t, err)
			jobs[i] = job
			if job.FinalizedAt != nil {
				final++
			}
		}
		if final == len(ids) {
			return jobs
		}
		if time.Now().After(deadline) {
			for _, j := range jobs {
				if j.FinalizedAt == nil {
					t.Logf("job %d: %s, attempt %d, scheduled %v, errors %v", j.ID, j.State, j.Attempt, j.ScheduledAt, j.Errors)
				}
			}
			t.Fatalf("%d of %d jobs finalized after %v", final, len(ids), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// insert inserts args as one job each and returns their ids.
func insert(t *testing.T, c *river.Client[pgx.Tx], args ...river.JobArgs) []int64 {
	t.Helper()
	params := make([]river.InsertManyParams, len(args))
	for i, a := range args {
		params[i] = river.InsertManyParams{Args: a}
	}
	res, err := c.InsertMany(context.Background(), params)
	require.NoError(t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids
}

// free returns the free slots of the Concurrency limit name for key.
func (e *env) free(t *testing.T, name, key string) float64 {
	t.Helper()
	res, err := e.limiter.Check(context.Background(), name, key, txlimit.Count(0))
	require.NoError(t, err)
	return res.Remaining
}

// tenantArgs is the job of the tests: one per tenant and sequence number.
type tenantArgs struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
	Fail   string `json:"fail,omitempty"` // "error", "panic" or "timeout": how its first attempt ends
}

func (tenantArgs) Kind() string { return "tenant_job" }

// otherArgs is a kind no rule names.
type otherArgs struct {
	Tenant string `json:"tenant"`
}

func (otherArgs) Kind() string { return "other_job" }

// tenantWorker works tenantArgs with work; a first attempt meant to time
// out gets a short timeout.
type tenantWorker struct {
	river.WorkerDefaults[tenantArgs]
	work func(ctx context.Context, job *river.Job[tenantArgs]) error
}

func (w *tenantWorker) Work(ctx context.Context, job *river.Job[tenantArgs]) error {
	return w.work(ctx, job)
}

func (w *tenantWorker) Timeout(job *river.Job[tenantArgs]) time.Duration {
	if job.Args.Fail == "timeout" && job.Attempt == 1 {
		return 100 * time.Millisecond
	}
	return 0 // the client's
}

// eventLog collects the limiter's Events.
type eventLog struct {
	mu      sync.Mutex
	events  []txlimit.Event
	observe func(txlimit.Event)
}

func (l *eventLog) add(_ context.Context, e txlimit.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	if l.observe != nil {
		l.observe(e)
	}
}

// of returns the Events of op (all when op is ""), in order.
func (l *eventLog) of(op string) []txlimit.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []txlimit.Event
	for _, e := range l.events {
		if op == "" || e.Op == op {
			out = append(out, e)
		}
	}
	return out
}

// snoozes records the snoozes the riverlimit middleware returns: a
// middleware placed outside it.
type snoozes struct {
	river.MiddlewareDefaults
	mu  sync.Mutex
	log map[int64][]time.Duration // per job id
}

func (s *snoozes) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	err := doInner(ctx)
	var snooze *river.JobSnoozeError
	if errors.As(err, &snooze) {
		s.mu.Lock()
		if s.log == nil {
			s.log = map[int64][]time.Duration{}
		}
		s.log[job.ID] = append(s.log[job.ID], snooze.Duration)
		s.mu.Unlock()
	}
	return err
}

func (s *snoozes) all() map[int64][]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64][]time.Duration{}
	for id, ds := range s.log {
		out[id] = append([]time.Duration(nil), ds...)
	}
	return out
}
