package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
)

// emailLimit is the name of the limit on outgoing emails, one bucket per
// user.
const emailLimit = "emails"

// tokensPerEmail is what one email costs. It travels in the job's arguments
// so that a cancelled job gives back exactly what it took.
const tokensPerEmail = 1.0

// emailLimitConfig allows a burst of 2 emails per user and then 1 per
// second (2 per 2 s), and lets a user run up to 4 emails ahead, scheduled for
// later: so, at most 4 s ahead (MaxReserved/Rate × Period). The numbers are
// small so that the demo's scheduled jobs run within seconds.
var emailLimitConfig = txlimit.Config{
	Kind:        txlimit.TokenBucket,
	Rate:        2,
	Period:      2 * time.Second,
	MaxReserved: 4,
}

// EmailArgs are the arguments of the job that sends one email.
type EmailArgs struct {
	User    string  `json:"user"`
	Subject string  `json:"subject"`
	Tokens  float64 `json:"tokens"`
}

// Kind implements river.JobArgs.
func (EmailArgs) Kind() string { return "send_email" }

// EmailWorker sends emails. It does not check the limit: the tokens were
// taken, or reserved, in the transaction that enqueued the job, and River
// does not run the job before its ScheduledAt.
type EmailWorker struct {
	river.WorkerDefaults[EmailArgs]
	pool *pgxpool.Pool
}

// Work "sends" the email by recording when it ran, and completes the job in
// the same transaction, so the record and the completion commit together.
func (w *EmailWorker) Work(ctx context.Context, job *river.Job[EmailArgs]) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE emails SET sent_at = clock_timestamp() WHERE job_id = $1`, job.ID); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// App is the application: a pool, the limiter and the River client, all in
// one dedicated schema that Close drops.
type App struct {
	Schema  string
	Pool    *pgxpool.Pool
	Limiter *txlimit.Limiter[pgx.Tx]
	River   *river.Client[pgx.Tx]
}

// Setup creates a schema of its own on the server at databaseURL, runs
// txlimit's migrations, River's migrations and the app's own table in it, and
// returns the app with its River client built but not started. clock, when
// not nil, replaces the database clock for the limiter (tests use a frozen
// one); the demo uses the database clock, which River's scheduler uses too.
func Setup(ctx context.Context, databaseURL string, clock func() time.Time) (_ *App, err error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_river_" + hex.EncodeToString(b)

	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("the database URL: %w", err)
	}
	// Every connection finds txlimit's table, River's tables and the app's
	// own in the schema. (Setting search_path to a schema that does not
	// exist yet is allowed; it is created below.)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	app := &App{Schema: schema, Pool: pool}
	defer func() {
		if err != nil {
			app.Close(context.WithoutCancel(ctx))
		}
	}()

	// txlimit's migrations run through goose, on a *sql.DB over the pool,
	// recorded in txlimit's own goose version table.
	sqlDB := stdlib.OpenDBFromPool(pool)
	err = migrations.Up(ctx, sqlDB, migrations.Postgres)
	_ = sqlDB.Close() // does not close the pool
	if err != nil {
		return nil, err
	}
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	// The app's own table: one row per email, written in the transaction
	// that takes the tokens and enqueues the job. idempotency_key makes a
	// retried request fail instead of sending twice.
	if _, err := pool.Exec(ctx, `CREATE TABLE emails (
		idempotency_key text PRIMARY KEY,
		user_id         text NOT NULL,
		subject         text NOT NULL,
		job_id          bigint NOT NULL UNIQUE,
		reserved_at     timestamptz NOT NULL, -- the limiter's clock at the decision
		run_after       timestamptz NOT NULL, -- reserved_at + RetryAfter
		sent_at         timestamptz,
		cancelled_at    timestamptz
	)`); err != nil {
		return nil, fmt.Errorf("create emails: %w", err)
	}

	var opts *txlimit.Options
	if clock != nil {
		opts = &txlimit.Options{Clock: clock}
	}
	app.Limiter, err = txlimit.New(pgstore.New(pool), map[string]txlimit.Config{emailLimit: emailLimitConfig}, opts)
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &EmailWorker{pool: pool})
	app.River, err = river.NewClient(driver, &river.Config{
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Schema:  schema,
		Workers: workers,
	})
	if err != nil {
		return nil, err
	}
	return app, nil
}

// Close stops the River client if it runs, drops the app's schema and
// closes the pool.
func (a *App) Close(ctx context.Context) {
	if a.River != nil {
		_ = a.River.Stop(ctx) // an error only says it was not started
	}
	_, err := a.Pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{a.Schema}.Sanitize()+" CASCADE")
	if err != nil {
		fmt.Fprintf(os.Stderr, "drop schema %s: %v\n", a.Schema, err)
	}
	a.Pool.Close()
}

// Sent describes an email that was accepted.
type Sent struct {
	JobID int64
	// Result is the limiter's decision: OK, and RetryAfter > 0 when the
	// tokens were reserved and the email is scheduled for later.
	Result txlimit.Result
	// RunAfter is when the limit lets the email go: Result.At +
	// Result.RetryAfter. The job is scheduled for it.
	RunAfter time.Time
}

// SendEmail accepts an email from user, in one transaction: it takes a token
// of user's limit (reserving one when there is none left), enqueues the job
// that sends the email, scheduled for when the token exists, and records the
// email. The three commit together or not at all, so a failure anywhere (a
// duplicate idempotency key, a lost connection) leaves neither a job nor
// spent tokens. When the user is more than MaxReserved tokens in debt, the
// limiter denies the request and SendEmail returns its error, a
// *txlimit.RateLimitedError with the RetryAfter.
func (a *App) SendEmail(ctx context.Context, user, subject, idempotencyKey string) (Sent, error) {
	tx, err := a.Pool.Begin(ctx)
	if err != nil {
		return Sent{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit

	res, err := a.Limiter.LimitTx(ctx, tx, emailLimit, user, txlimit.Reserve(), txlimit.Count(tokensPerEmail))
	if err != nil {
		return Sent{}, err
	}
	if !res.OK {
		return Sent{Result: res}, res.Err()
	}
	runAfter := res.At.Add(res.RetryAfter)
	// A zero ScheduledAt makes the job available at once; River would put a
	// job with any ScheduledAt, even one in the past, through its scheduler,
	// which runs every few seconds.
	var opts river.InsertOpts
	if res.RetryAfter > 0 { // reserved: OK, and the tokens exist only later
		opts.ScheduledAt = runAfter
	}
	job, err := a.River.InsertTx(ctx, tx, EmailArgs{User: user, Subject: subject, Tokens: tokensPerEmail}, &opts)
	if err != nil {
		return Sent{}, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO emails (idempotency_key, user_id, subject, job_id, reserved_at, run_after)
		VALUES ($1, $2, $3, $4, $5, $6)`, idempotencyKey, user, subject, job.Job.ID, res.At, runAfter)
	if err != nil {
		return Sent{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Sent{}, err
	}
	return Sent{JobID: job.Job.ID, Result: res, RunAfter: runAfter}, nil
}

// ErrAlreadyCancelled is returned by CancelEmail for an email cancelled
// before.
var ErrAlreadyCancelled = errors.New("email already cancelled")

// CancelEmail cancels the job of an email that has not run and gives its
// tokens back to the user's limit, in one transaction. credited is false when
// the job was already running or done: River then only flags it, the email
// goes out (or went out), and its tokens stay spent.
//
// The email's row is locked first so that two cancellations of the same
// email cannot both credit: CreditTx adds tokens every time it is called.
func (a *App) CancelEmail(ctx context.Context, jobID int64) (credited bool, err error) {
	err = pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		var user string
		var cancelled bool
		err := tx.QueryRow(ctx, `SELECT user_id, cancelled_at IS NOT NULL FROM emails WHERE job_id = $1 FOR UPDATE`,
			jobID).Scan(&user, &cancelled)
		if err != nil {
			return fmt.Errorf("email of job %d: %w", jobID, err)
		}
		if cancelled {
			return ErrAlreadyCancelled
		}
		job, err := a.River.JobCancelTx(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if job.State != rivertype.JobStateCancelled {
			return nil // running or finished: the tokens were used
		}
		var args EmailArgs
		if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
			return err
		}
		if err := a.Limiter.CreditTx(ctx, tx, emailLimit, user, args.Tokens); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE emails SET cancelled_at = clock_timestamp() WHERE job_id = $1`, jobID); err != nil {
			return err
		}
		credited = true
		return nil
	})
	return credited, err
}
