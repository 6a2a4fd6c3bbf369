package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/jitter"
)

// Report is what Demo did.
type Report struct {
	// Start is the clock reading of the first decision; the timeline's
	// offsets are from it.
	Start time.Time
	// Sent are the accepted emails in the order they were sent.
	Sent []Sent
	// Denied are the refused requests' results.
	Denied []txlimit.Result
	// RolledBack counts the requests whose transaction failed after the
	// reservation and the job insert.
	RolledBack int
	// Cancelled are the jobs cancelled before they ran, whose tokens came
	// back.
	Cancelled []int64
	// Timeline has one row per job, in job order, read back after every
	// job has finished.
	Timeline []TimelineRow
}

// TimelineRow is one job as the database recorded it.
type TimelineRow struct {
	JobID       int64
	User        string
	Subject     string
	State       rivertype.JobState
	ReservedAt  time.Time  // the limiter's decision
	RunAfter    time.Time  // ReservedAt + RetryAfter
	ScheduledAt time.Time  // River's scheduled_at
	AttemptedAt *time.Time // when River's fetch took the job
	SentAt      *time.Time // when the worker ran
}

// jobsTimeout bounds the wait for the scheduled jobs. The last one is due
// about MaxReserved/Rate × Period = 4 s after the start. River's scheduler
// makes scheduled jobs available up to 5 s ahead of time, and its producers
// fetch only those whose scheduled_at has passed on the database clock,
// polling every second: a job runs up to about a second late, never early.
const jobsTimeout = time.Minute

// Demo starts River, sends emails for two users through SendEmail, cancels
// one, waits for every other job to run, and prints what happened. It returns
// an error if a job ran before its scheduled time.
func (a *App) Demo(ctx context.Context, out io.Writer) (*Report, error) {
	events, unsubscribe := a.River.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	defer unsubscribe()
	if err := a.River.Start(ctx); err != nil {
		return nil, err
	}
	cfg := emailLimitConfig
	oneToken := time.Duration(float64(cfg.Period) / cfg.Rate)
	fmt.Fprintf(out, "limit %q per user: token bucket, %v tokens per %v (one every %v), capacity %v, MaxReserved %v\n\n",
		emailLimit, cfg.Rate, cfg.Period, oneToken, cfg.Rate, cfg.MaxReserved)

	r := &Report{}
	offset := func(t time.Time) string { return fmt.Sprintf("%+.3fs", t.Sub(r.Start).Seconds()) }
	accepted := func(subject string, s Sent) {
		if len(r.Sent) == 0 {
			r.Start = s.Result.At
		}
		r.Sent = append(r.Sent, s)
		how := "sent now"
		if s.Result.RetryAfter > 0 {
			how = fmt.Sprintf("reserved, runs after %v", s.Result.RetryAfter.Round(time.Millisecond))
		}
		fmt.Fprintf(out, "  %-9s job %-2d  at %s  %s\n", subject, s.JobID, offset(s.Result.At), how)
	}

	// alice sends 7 emails at once: 2 go now, 4 are reserved one second
	// apart, and the 7th would be 5 ahead, which MaxReserved refuses.
	fmt.Fprintln(out, "alice sends 7 emails at once:")
	for i := 1; i <= 7; i++ {
		subject := fmt.Sprintf("alice #%d", i)
		s, err := a.SendEmail(ctx, "alice", subject, fmt.Sprintf("alice-%d", i))
		var limited *txlimit.RateLimitedError
		switch {
		case errors.As(err, &limited):
			r.Denied = append(r.Denied, s.Result)
			fmt.Fprintf(out, "  %-9s refused: %d emails already waiting; retry after %v (with jitter: %v), nothing enqueued\n",
				subject, int(cfg.MaxReserved), limited.RetryAfter.Round(time.Millisecond),
				jitter.Spread(limited.RetryAfter, oneToken).Round(time.Millisecond))
		case err != nil:
			return r, err
		default:
			accepted(subject, s)
		}
	}

	// bob's client sends its request twice (a retry after a timeout, say).
	// The second attempt reserves a token and inserts a job, then fails on
	// the idempotency key: the rollback takes both back.
	fmt.Fprintln(out, "\nbob sends 1 email, and his client retries the request:")
	s, err := a.SendEmail(ctx, "bob", "bob #1", "bob-1")
	if err != nil {
		return r, err
	}
	accepted("bob #1", s)
	_, err = a.SendEmail(ctx, "bob", "bob #1", "bob-1")
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "23505" {
		return r, fmt.Errorf("the duplicate request should fail with a unique violation, got %v", err)
	}
	r.RolledBack++
	fmt.Fprintln(out, "  bob #1    retry failed (duplicate idempotency key): rolled back, no job, no token spent")

	// alice takes her last email back before it runs.
	last := r.Sent[len(r.Sent)-2] // alice's last; bob's is after it
	before, err := a.Limiter.Check(ctx, emailLimit, "alice")
	if err != nil {
		return r, err
	}
	credited, err := a.CancelEmail(ctx, last.JobID)
	if err != nil {
		return r, err
	}
	if !credited {
		return r, fmt.Errorf("job %d ran before it could be cancelled", last.JobID)
	}
	after, err := a.Limiter.Check(ctx, emailLimit, "alice")
	if err != nil {
		return r, err
	}
	r.Cancelled = append(r.Cancelled, last.JobID)
	fmt.Fprintf(out, "\nalice cancels job %d before it runs: its token comes back, alice's tokens %.3f → %.3f\n",
		last.JobID, before.Remaining, after.Remaining)

	want := len(r.Sent) - len(r.Cancelled)
	fmt.Fprintf(out, "\nwaiting for %d jobs to run...\n", want)
	timeout := time.After(jobsTimeout)
	for done := 0; done < want; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return r, fmt.Errorf("job %d: %s: %v", ev.Job.ID, ev.Kind, ev.Job.Errors)
			}
			done++
		case <-timeout:
			return r, fmt.Errorf("only %d of %d jobs ran within %v", done, want, jobsTimeout)
		case <-ctx.Done():
			return r, ctx.Err()
		}
	}

	r.Timeline, err = a.Timeline(ctx)
	if err != nil {
		return r, err
	}
	fmt.Fprintln(out, "\ntimeline (offsets from the first decision, all on the database clock):")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\temail\tenqueued\tscheduled for\tran\tlate by\tstate\t")
	var early []string
	for _, row := range r.Timeline {
		ran, late := "-", "-"
		if row.SentAt != nil {
			ran = offset(*row.SentAt)
			late = fmt.Sprintf("%.3fs", row.SentAt.Sub(row.RunAfter).Seconds())
			if row.SentAt.Before(row.RunAfter) || row.AttemptedAt == nil || row.AttemptedAt.Before(row.ScheduledAt) {
				early = append(early, fmt.Sprintf("job %d ran at %s, scheduled for %s", row.JobID, ran, offset(row.RunAfter)))
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			row.JobID, row.Subject, offset(row.ReservedAt), offset(row.RunAfter), ran, late, row.State)
	}
	if err := tw.Flush(); err != nil {
		return r, err
	}
	if len(early) > 0 {
		return r, fmt.Errorf("jobs ran before their scheduled time: %v", early)
	}
	fmt.Fprintf(out, "\nevery job ran at or after its scheduled time; %d sent, %d refused, %d rolled back, %d cancelled\n",
		want, len(r.Denied), r.RolledBack, len(r.Cancelled))
	return r, nil
}

// Timeline reads every job with its email, in job order.
func (a *App) Timeline(ctx context.Context) ([]TimelineRow, error) {
	rows, err := a.Pool.Query(ctx, `
		SELECT j.id, e.user_id, e.subject, j.state, e.reserved_at, e.run_after, j.scheduled_at, j.attempted_at, e.sent_at
		FROM river_job AS j
		JOIN emails AS e ON e.job_id = j.id
		ORDER BY j.id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TimelineRow, error) {
		var t TimelineRow
		var state string
		err := row.Scan(&t.JobID, &t.User, &t.Subject, &state, &t.ReservedAt, &t.RunAfter, &t.ScheduledAt, &t.AttemptedAt, &t.SentAt)
		t.State = rivertype.JobState(state)
		return t, err
	})
}
