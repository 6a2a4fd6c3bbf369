// Command riverlimit runs River jobs under a txlimit concurrency limit with
// the riverlimit middleware: at most 2 exports run at once per tenant.
//
// Seven export jobs are enqueued, five of tenant acme and two of globex, and
// a River client works them with 10 workers. The middleware acquires a slot
// of the tenant for each job before it runs (the job's id is the holder);
// acme's jobs beyond 2 are snoozed (river.JobSnooze: no attempt spent) for
// SlotWait plus jitter and try again. Each worker writes its export's row,
// releases its slot (riverlimit.ReleaseTx) and completes its job
// (river.JobCompleteTx) in one transaction, so the slot is free exactly when
// the export has committed. The program prints what ran, what was snoozed
// and for how long, and checks what it prints: no tenant ever ran more than
// 2 exports at once, every export completed, every slot is free at the end.
//
// The program works in a schema of its own, created at the start (txlimit's
// migrations through goose and River's through rivermigrate run there) and
// dropped at the end:
//
//	cd examples/riverlimit && go run .
//
// TEST_DATABASE_URL selects the server, as it does for the tests; it defaults
// to the local test server,
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/riverlimit"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// The limit: at most 2 exports running per tenant. A worker that dies
// mid-export keeps its slot until HoldFor after its last heartbeat (the
// middleware extends the slot every HoldFor/3 while the job runs).
const (
	exportsLimit = "exports"
	perTenant    = 2
	slotWait     = time.Second            // the longest a job denied a slot waits before trying again
	spread       = 250 * time.Millisecond // the jitter added to it
	exportTakes  = 400 * time.Millisecond // how long an export works
)

var limits = map[string]txlimit.Config{
	exportsLimit: {Kind: txlimit.Concurrency, Capacity: perTenant, HoldFor: 30 * time.Second},
}

// ExportArgs are the arguments of an export job.
type ExportArgs struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
}

// Kind implements river.JobArgs.
func (ExportArgs) Kind() string { return "export" }

// ExportWorker works exports: it writes the export's row, releases the
// tenant's slot and completes the job, in one transaction.
type ExportWorker struct {
	river.WorkerDefaults[ExportArgs]
	pool    *pgxpool.Pool
	running *running
}

// Work implements river.Worker.
func (w *ExportWorker) Work(ctx context.Context, job *river.Job[ExportArgs]) error {
	defer w.running.enter(job.Args.Tenant)()
	time.Sleep(exportTakes) // the export's work
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO exports (job_id, tenant, name) VALUES ($1, $2, $3)`,
			job.ID, job.Args.Tenant, job.Args.Name); err != nil {
			return err
		}
		// The slot is given back when this transaction commits, with the
		// export and the job's completion; the middleware's own release
		// after Work then finds nothing to do.
		if _, err := riverlimit.ReleaseTx(ctx, tx); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// running counts the exports running per tenant, and the most at once.
type running struct {
	mu   sync.Mutex
	now  map[string]int
	peak map[string]int
}

func (r *running) enter(tenant string) (exit func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now[tenant]++
	r.peak[tenant] = max(r.peak[tenant], r.now[tenant])
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.now[tenant]--
	}
}

// snoozeLog is a worker middleware placed before riverlimit's: it records
// the snoozes riverlimit returns, per job. An application would log them.
type snoozeLog struct {
	river.MiddlewareDefaults
	mu    sync.Mutex
	byJob map[int64][]time.Duration
}

func (s *snoozeLog) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	err := doInner(ctx)
	var snooze *river.JobSnoozeError
	if errors.As(err, &snooze) {
		s.mu.Lock()
		s.byJob[job.ID] = append(s.byJob[job.ID], snooze.Duration)
		s.mu.Unlock()
	}
	return err
}

func run(ctx context.Context, databaseURL string, out io.Writer) (err error) {
	pool, schema, err := setup(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer func() {
		_, dropErr := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
		err = cmp.Or(err, dropErr)
	}()

	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
	if err != nil {
		return err
	}
	// The middleware: export jobs take a slot of "exports", keyed by the
	// tenant of their arguments.
	mw, err := riverlimit.New(limiter, riverlimit.Config{
		Rules: []riverlimit.Rule{{
			Kinds:  []string{ExportArgs{}.Kind()},
			Limits: []string{exportsLimit},
			Key:    riverlimit.ArgsKey(func(a ExportArgs) string { return a.Tenant }),
		}},
		SlotWait: slotWait,
		Spread:   spread,
	})
	if err != nil {
		return err
	}
	run := &running{now: map[string]int{}, peak: map[string]int{}}
	snoozes := &snoozeLog{byJob: map[int64][]time.Duration{}}
	workers := river.NewWorkers()
	river.AddWorker(workers, &ExportWorker{pool: pool, running: run})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		Schema:            schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		FetchPollInterval: 100 * time.Millisecond,
		Middleware:        []rivertype.Middleware{snoozes, mw},
		Workers:           workers,
	})
	if err != nil {
		return err
	}

	jobs := map[string]int{"acme": 5, "globex": 2}
	var params []river.InsertManyParams
	tenantOf := map[int64]string{}
	for _, tenant := range []string{"acme", "globex"} {
		for i := range jobs[tenant] {
			params = append(params, river.InsertManyParams{Args: ExportArgs{Tenant: tenant, Name: fmt.Sprintf("report-%d", i+1)}})
		}
	}
	inserted, err := client.InsertMany(ctx, params)
	if err != nil {
		return err
	}
	ids := make([]int64, len(inserted))
	for i, r := range inserted {
		ids[i] = r.Job.ID
		tenantOf[r.Job.ID] = params[i].Args.(ExportArgs).Tenant
	}
	fmt.Fprintf(out, "%d exports enqueued: acme %d, globex %d; at most %d run at once per tenant\n",
		len(ids), jobs["acme"], jobs["globex"], perTenant)

	completed, events := client.Subscribe(river.EventKindJobCompleted)
	defer events()
	if err := client.Start(ctx); err != nil {
		return err
	}
	for done := 0; done < len(ids); {
		select {
		case <-completed:
			done++
		case <-time.After(time.Minute):
			return fmt.Errorf("%d of %d exports completed in a minute", done, len(ids))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := client.Stop(ctx); err != nil {
		return err
	}

	// What ran and what waited, per tenant.
	waited := map[string]int{}
	var shortest, longest time.Duration
	for id, ds := range snoozes.byJob {
		waited[tenantOf[id]]++
		for _, d := range ds {
			if shortest == 0 || d < shortest {
				shortest = d
			}
			longest = max(longest, d)
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM exports WHERE tenant = $1`, tenant).Scan(&n); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: %d exports done, at most %d at once; %d waited for a slot (snoozed, no attempt spent)\n",
			tenant, n, run.peak[tenant], waited[tenant])
		if run.peak[tenant] > perTenant {
			return fmt.Errorf("%s ran %d exports at once, more than %d", tenant, run.peak[tenant], perTenant)
		}
	}
	if len(snoozes.byJob) > 0 && shortest >= slotWait && longest < slotWait+spread {
		fmt.Fprintf(out, "snoozes: each for the %v SlotWait plus jitter below %v\n", slotWait, spread)
	} else {
		fmt.Fprintf(out, "snoozes: from %v to %v\n", shortest, longest)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT max(attempt) FROM river_job`).Scan(&attempts); err != nil {
		return err
	}
	fmt.Fprintf(out, "attempts: at most %d per job\n", attempts)
	free := 0
	for _, tenant := range []string{"acme", "globex"} {
		res, err := limiter.Check(ctx, exportsLimit, tenant, txlimit.Count(0))
		if err != nil {
			return err
		}
		free += int(res.Remaining)
	}
	fmt.Fprintf(out, "slots: released in the transactions that completed the jobs; %d of %d free at the end\n", free, 2*perTenant)
	return nil
}

// setup creates a schema of its own on the server at databaseURL, with
// txlimit's migrations, River's and the exports table, and returns a pool
// whose connections use it.
func setup(ctx context.Context, databaseURL string) (_ *pgxpool.Pool, schema string, err error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "txlimit_riverlimit_" + hex.EncodeToString(b)
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, "", fmt.Errorf("the database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("create schema: %w", err)
	}
	defer func() {
		if err != nil {
			_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			pool.Close()
		}
	}()
	sqlDB := stdlib.OpenDBFromPool(pool)
	err = migrations.Up(ctx, sqlDB, migrations.Postgres)
	_ = sqlDB.Close() // does not close the pool
	if err != nil {
		return nil, "", err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return nil, "", err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, "", fmt.Errorf("river migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE exports (job_id bigint PRIMARY KEY, tenant text NOT NULL, name text NOT NULL)`); err != nil {
		return nil, "", err
	}
	return pool, schema, nil
}
