package riverlimit_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/riverlimit"
)

// ExportArgs are the arguments of an export job, one per tenant's export.
type ExportArgs struct {
	Tenant string `json:"tenant"`
}

func (ExportArgs) Kind() string { return "export" }

// ExportWorker writes the export, releases the tenant's slot and completes
// the job in one transaction: the slot is free exactly when the export has
// committed.
type ExportWorker struct {
	river.WorkerDefaults[ExportArgs]
	pool *pgxpool.Pool
}

func (w *ExportWorker) Work(ctx context.Context, job *river.Job[ExportArgs]) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO exports (job_id, tenant) VALUES ($1, $2)`, job.ID, job.Args.Tenant); err != nil {
			return err
		}
		if _, err := riverlimit.ReleaseTx(ctx, tx); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// At most 3 exports running per tenant: the middleware holds a slot of the
// tenant while an export job runs, and snoozes the tenant's other export jobs
// until one is free. examples/riverlimit runs the whole program.
//
// This example needs a PostgreSQL server with txlimit's and River's
// migrations applied, so go test compiles it but does not run it.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		// A dead worker's slot comes back a minute after its last heartbeat.
		"exports": {Kind: txlimit.Concurrency, Capacity: 3, HoldFor: time.Minute},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := riverlimit.New(limiter, riverlimit.Config{Rules: []riverlimit.Rule{{
		Kinds:  []string{ExportArgs{}.Kind()},
		Limits: []string{"exports"},
		Key:    riverlimit.ArgsKey(func(a ExportArgs) string { return a.Tenant }),
	}}})
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &ExportWorker{pool: pool})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Middleware: []rivertype.Middleware{mw},
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers:    workers,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)
	for range 10 {
		if _, err := client.Insert(ctx, ExportArgs{Tenant: "acme"}, nil); err != nil {
			log.Fatal(err)
		}
	}
}
