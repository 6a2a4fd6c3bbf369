package riverlimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/riverlimit"
)

// tenantRule is the rule of the tests: tenant_job takes the limits, keyed
// by the job's tenant.
func tenantRule(limits ...string) riverlimit.Rule {
	return riverlimit.Rule{
		Kinds:  []string{tenantArgs{}.Kind()},
		Limits: limits,
		Key:    riverlimit.ArgsKey(func(a tenantArgs) string { return a.Tenant }),
	}
}

// running counts the jobs running per tenant, observed inside the jobs.
type running struct {
	mu   sync.Mutex
	now  map[string]*atomic.Int32
	peak map[string]int32
	over atomic.Int32 // times a job saw more than the capacity running
}

func newRunning(tenants ...string) *running {
	r := &running{now: map[string]*atomic.Int32{}, peak: map[string]int32{}}
	for _, t := range tenants {
		r.now[t] = new(atomic.Int32)
	}
	return r
}

// enter counts a job of tenant in and returns how to count it out.
func (r *running) enter(tenant string, capacity int32) func() {
	n := r.now[tenant].Add(1)
	if n > capacity {
		r.over.Add(1)
	}
	r.mu.Lock()
	r.peak[tenant] = max(r.peak[tenant], n)
	r.mu.Unlock()
	return func() { r.now[tenant].Add(-1) }
}

// TestTenantsNeverExceedSlots: 50 jobs of 5 tenants, 3 slots per tenant, 20
// workers. Never more than 3 run at once per tenant (counted inside the
// jobs), every tenant reaches 3, and all 50 complete. A tenant's jobs
// beyond 3 are snoozed, which costs them no attempt; the jobs whose first
// attempt fails (an error, a panic, a timeout) give their slot back as the
// others do, and run again.
func TestTenantsNeverExceedSlots(t *testing.T) {
	t.Parallel()
	const (
		capacity = 3
		tenants  = 5
		perTen   = 10
		limit    = "jobs"
	)
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: capacity, HoldFor: 30 * time.Second}})
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%d", i)
	}
	run := newRunning(names...)
	var runs atomic.Int32
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		runs.Add(1)
		out := run.enter(job.Args.Tenant, capacity)
		defer out()
		if job.Attempt == 1 {
			switch job.Args.Fail {
			case "error":
				time.Sleep(30 * time.Millisecond)
				return errors.New("first attempt fails")
			case "panic":
				time.Sleep(30 * time.Millisecond)
				panic("first attempt panics")
			case "timeout":
				<-ctx.Done() // the worker's 100ms timeout
				return ctx.Err()
			}
		}
		// Stay until the tenant runs capacity jobs (or a second passes: the
		// tenant's last jobs), so that the limit is reached, not only kept.
		for wait := time.Now().Add(time.Second); run.now[job.Args.Tenant].Load() < capacity && time.Now().Before(wait); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		return nil
	}})
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)},
		SlotWait: 50 * time.Millisecond, Spread: 50 * time.Millisecond})
	c := e.client(t, nil, 0)
	var args []river.JobArgs
	failing := 0
	for i := range perTen {
		for _, name := range names {
			a := tenantArgs{Tenant: name, Seq: i}
			switch i {
			case 1:
				a.Fail = "error"
			case 2:
				a.Fail = "panic"
			case 3:
				a.Fail = "timeout"
			}
			if a.Fail != "" {
				failing++
			}
			args = append(args, a)
		}
	}
	ids := insert(t, c, args...)
	require.Len(t, ids, tenants*perTen)
	worker := e.client(t, workers, 20, mw)

	jobs := e.waitFinal(t, worker, ids, 2*time.Minute)
	snoozed := 0
	for i, j := range jobs {
		require.Equal(t, rivertype.JobStateCompleted, j.State, "job %d", j.ID)
		a := args[i].(tenantArgs)
		want := 1
		if a.Fail != "" {
			want = 2
		}
		require.Equal(t, want, j.Attempt, "job %d (%+v): a snooze costs no attempt, a failure one", j.ID, a)
		var meta struct {
			Snoozes int `json:"snoozes"`
		}
		require.NoError(t, json.Unmarshal(j.Metadata, &meta))
		snoozed += meta.Snoozes
	}
	t.Logf("%d runs, %d snoozes, peaks %v", runs.Load(), snoozed, run.peak)
	require.Zero(t, run.over.Load(), "more than %d jobs of a tenant ran at once", capacity)
	for _, name := range names {
		require.EqualValues(t, capacity, run.peak[name], "tenant %s never ran %d jobs at once", name, capacity)
		require.EqualValues(t, capacity, e.free(t, limit, name), "tenant %s: every slot was given back", name)
	}
	require.Positive(t, snoozed, "jobs beyond the capacity were snoozed")
	require.EqualValues(t, len(ids)+failing, runs.Load(), "each job ran once, and once more after its failure")

	// Every run held its slot from a grant to a release that found it live,
	// as the job's holder.
	var granted, released int
	for _, ev := range e.events.of("limit_all") {
		if ev.Result.OK {
			granted++
			require.Regexp(t, `^river-job-\d+$`, ev.Holder)
		}
	}
	for _, ev := range e.events.of("release") {
		require.NoError(t, ev.Err)
		require.True(t, ev.Result.OK, "release of %s found its slot live", ev.Holder)
		released++
	}
	require.Equal(t, int(runs.Load()), granted)
	require.Equal(t, granted, released)
}

// TestSnoozeJitter: jobs denied a slot are snoozed for SlotWait (the slot's
// RetryAfter, the blocker's expiry an hour away, is longer) plus a jitter
// below Spread, each for a different time, without an attempt; once the
// slot is free they run.
func TestSnoozeJitter(t *testing.T) {
	t.Parallel()
	const (
		limit    = "jobs"
		slotWait = 300 * time.Millisecond
		spread   = 400 * time.Millisecond
		n        = 8
	)
	ctx := context.Background()
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Hour}})
	blocker, err := e.limiter.Limit(ctx, limit, "t", txlimit.Holder("blocker"))
	require.NoError(t, err)
	require.True(t, blocker.OK)

	var ran atomic.Int32
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		ran.Add(1)
		return nil
	}})
	snz := &snoozes{}
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)}, SlotWait: slotWait, Spread: spread})
	c := e.client(t, nil, 0)
	args := make([]river.JobArgs, n)
	for i := range args {
		args[i] = tenantArgs{Tenant: "t", Seq: i}
	}
	ids := insert(t, c, args...)
	worker := e.client(t, workers, n, snz, mw)

	// Every job is snoozed twice at least, and none runs.
	deadline := time.Now().Add(time.Minute)
	for {
		all := snz.all()
		enough := len(all) == n
		for _, ds := range all {
			enough = enough && len(ds) >= 2
		}
		if enough {
			break
		}
		require.True(t, time.Now().Before(deadline), "the jobs were not all snoozed twice: %v", all)
		time.Sleep(50 * time.Millisecond)
	}
	require.Zero(t, ran.Load(), "no job ran while the blocker held the only slot")
	seen := map[time.Duration]bool{}
	for id, ds := range snz.all() {
		for _, d := range ds {
			require.GreaterOrEqual(t, d, slotWait, "job %d", id)
			require.Less(t, d, slotWait+spread, "job %d", id)
			seen[d] = true
		}
		job, err := worker.JobGet(ctx, id)
		require.NoError(t, err)
		require.LessOrEqual(t, job.Attempt, 1, "job %d: snoozes cost no attempt (errors: %v)", id, job.Errors)
	}
	require.Greater(t, len(seen), n, "the snoozes are spread, not the same")

	released, err := e.limiter.Release(ctx, limit, "t", "blocker")
	require.NoError(t, err)
	require.True(t, released)
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	for _, j := range jobs {
		require.Equal(t, rivertype.JobStateCompleted, j.State)
		require.Equal(t, 1, j.Attempt)
	}
	require.EqualValues(t, n, ran.Load())
}

// TestRateLimitSnoozesForRetryAfter: a rule with a rate limit beside the
// slot. A job denied by the rate limit is snoozed for the denial's
// RetryAfter (exact: SlotWait does not cap it), plus jitter, and runs once
// the token is there; each run takes a token.
func TestRateLimitSnoozesForRetryAfter(t *testing.T) {
	t.Parallel()
	const spread = 100 * time.Millisecond
	e := newEnv(t, map[string]txlimit.Config{
		"slots": {Kind: txlimit.Concurrency, Capacity: 2, HoldFor: 30 * time.Second},
		"rate":  {Kind: txlimit.TokenBucket, Rate: 1, Period: 2 * time.Second, Capacity: 1},
	})
	starts := make(chan time.Time, 2)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		starts <- time.Now()
		return nil
	}})
	snz := &snoozes{}
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule("slots", "rate")},
		SlotWait: 50 * time.Millisecond, Spread: spread})
	c := e.client(t, nil, 0)
	ids := insert(t, c, tenantArgs{Tenant: "t", Seq: 0}, tenantArgs{Tenant: "t", Seq: 1})
	worker := e.client(t, workers, 2, snz, mw)
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	for _, j := range jobs {
		require.Equal(t, rivertype.JobStateCompleted, j.State)
		require.Equal(t, 1, j.Attempt)
	}
	first, second := <-starts, <-starts
	require.GreaterOrEqual(t, second.Sub(first), 1500*time.Millisecond, "the second job waited for the next token")

	// The denials, in order, and the snoozes they caused.
	var denials []txlimit.Event
	for _, ev := range e.events.of("limit_all") {
		if ev.Name == "rate" && !ev.Result.OK {
			denials = append(denials, ev)
		}
	}
	require.NotEmpty(t, denials)
	var snoozed []time.Duration
	for _, ds := range snz.all() {
		snoozed = append(snoozed, ds...)
	}
	require.Len(t, snoozed, len(denials), "one snooze per denial")
	// The snoozed job's snoozes, matched with the denials in order.
	for i, d := range snz.all()[otherID(snz.all())] {
		ra := denials[i].Result.RetryAfter
		require.Positive(t, ra)
		require.GreaterOrEqual(t, d, ra, "snoozed for the rate limit's RetryAfter, not SlotWait")
		require.Less(t, d, ra+spread)
	}
}

// otherID is the only job id of m.
func otherID(m map[int64][]time.Duration) int64 {
	for id := range m {
		return id
	}
	return 0
}

// TestReleaseInCompleteTx: a worker completes its job with JobCompleteTx
// and releases its slot with ReleaseTx in the same transaction. Until that
// transaction commits the slot is held (another connection sees it taken);
// at the commit it is free, and the middleware's own release afterwards
// finds nothing to release. A worker whose transaction rolls back after
// ReleaseTx leaves no slot behind either: the middleware releases it.
func TestReleaseInCompleteTx(t *testing.T) {
	t.Parallel()
	const limit = "jobs"
	ctx := context.Background()
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: 30 * time.Second}})
	_, err := e.pool.Exec(ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY)`)
	require.NoError(t, err)

	type seen struct {
		beforeRelease, afterRelease, afterCommit float64 // free slots another connection sees
		released                                 bool
	}
	results := make(chan seen, 2)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		var s seen
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1)`, job.ID); err != nil {
				return err
			}
			s.beforeRelease = e.free(t, limit, job.Args.Tenant)
			var err error
			if s.released, err = riverlimit.ReleaseTx(ctx, tx); err != nil {
				return err
			}
			s.afterRelease = e.free(t, limit, job.Args.Tenant) // not committed yet
			if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
				return err
			}
			if job.Args.Fail == "rollback" {
				return errors.New("rolled back after ReleaseTx")
			}
			return nil
		})
		s.afterCommit = e.free(t, limit, job.Args.Tenant)
		results <- s
		return err
	}})
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)}})
	worker := e.client(t, workers, 1, mw)

	// Committed: the slot is freed by the commit.
	ids := insert(t, worker, tenantArgs{Tenant: "a"})
	s := <-results
	require.True(t, s.released, "ReleaseTx found the slot live")
	require.Zero(t, s.beforeRelease, "the job holds the only slot")
	require.Zero(t, s.afterRelease, "the release is not committed yet")
	require.EqualValues(t, 1, s.afterCommit, "the commit freed the slot")
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE job_id = $1`, ids[0]).Scan(&n))
	require.Equal(t, 1, n, "the work committed with the completion")
	holder := riverlimit.Holder(jobs[0])
	releases := func() []bool { // the job's completion commits before the middleware's release runs
		var outcomes []bool
		for _, ev := range e.events.of("release") {
			if ev.Holder == holder {
				outcomes = append(outcomes, ev.Result.OK)
			}
		}
		return outcomes
	}
	require.Eventually(t, func() bool { return len(releases()) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []bool{true, false}, releases(), "ReleaseTx released the slot; the middleware's release after the work found it gone")

	// Rolled back: neither the work nor the release committed, the job
	// failed its attempt, and the middleware released the slot.
	ids = insert(t, worker, tenantArgs{Tenant: "b", Fail: "rollback"})
	s = <-results
	require.True(t, s.released)
	require.Zero(t, s.afterCommit, "the rollback undid the release: the slot is held until the middleware's release")
	require.Eventually(t, func() bool { return e.free(t, limit, "b") == 1 }, 10*time.Second, 10*time.Millisecond,
		"the middleware released the slot after the rolled-back work")
	job, err := worker.JobGet(ctx, ids[0])
	require.NoError(t, err)
	require.NotEqual(t, rivertype.JobStateCompleted, job.State)
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE job_id = $1`, ids[0]).Scan(&n))
	require.Zero(t, n)
}

// TestSameJobSameHolder: a job whose earlier attempt's slot is still live
// (its worker died; River's rescuer ran it again) is granted that slot as
// the same holder and holds no second one: with the only slot of its key
// held by its own holder id, the job runs at once.
func TestSameJobSameHolder(t *testing.T) {
	t.Parallel()
	const limit = "jobs"
	ctx := context.Background()
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Hour}})
	c := e.client(t, nil, 0)
	ids := insert(t, c, tenantArgs{Tenant: "t"})
	job, err := c.JobGet(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("river-job-%d", ids[0]), riverlimit.Holder(job))
	// The earlier attempt's slot.
	res, err := e.limiter.Limit(ctx, limit, "t", txlimit.Holder(riverlimit.Holder(job)))
	require.NoError(t, err)
	require.True(t, res.OK)

	ran := make(chan float64, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		ran <- e.free(t, limit, "t")
		return nil
	}})
	snz := &snoozes{}
	worker := e.client(t, workers, 1, snz, e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)}}))
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
	require.Zero(t, <-ran, "the job held the one slot, its own")
	require.Empty(t, snz.all(), "not snoozed")
	require.EqualValues(t, 1, e.free(t, limit, "t"), "released after the work")
}

// TestHeartbeat: jobs that run for more than twice HoldFor keep their slot
// (the middleware extends it every HoldFor/3), so a second job of the key
// never runs beside the first; a job whose slot is taken from it mid-run
// (released by an operator) has its context cancelled with ErrSlotLost.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	const (
		limit   = "jobs"
		holdFor = time.Second
	)
	ctx := context.Background()
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: holdFor}})
	run := newRunning("long", "lost")
	lost := make(chan error, 1)
	holding := make(chan *river.Job[tenantArgs], 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		out := run.enter(job.Args.Tenant, 1)
		defer out()
		if job.Args.Tenant == "lost" {
			holding <- job
			<-ctx.Done()
			lost <- context.Cause(ctx)
			return river.JobCancel(context.Cause(ctx))
		}
		time.Sleep(5 * holdFor / 2)
		return nil
	}})
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)},
		SlotWait: 50 * time.Millisecond, Spread: 50 * time.Millisecond})
	worker := e.client(t, workers, 4, mw)
	ids := insert(t, worker, tenantArgs{Tenant: "long", Seq: 0}, tenantArgs{Tenant: "long", Seq: 1})
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	for _, j := range jobs {
		require.Equal(t, rivertype.JobStateCompleted, j.State)
	}
	require.Zero(t, run.over.Load(), "a second job ran beside one that outlived HoldFor")
	extends := 0
	for _, ev := range e.events.of("extend") {
		require.True(t, ev.Result.OK, "extended %s", ev.Holder)
		extends++
	}
	require.GreaterOrEqual(t, extends, 2*5, "two jobs of 2.5×HoldFor, extended every HoldFor/3")

	ids = insert(t, worker, tenantArgs{Tenant: "lost"})
	job := <-holding
	released, err := e.limiter.Release(ctx, limit, "lost", riverlimit.Holder(job.JobRow))
	require.NoError(t, err)
	require.True(t, released)
	select {
	case cause := <-lost:
		require.ErrorIs(t, cause, riverlimit.ErrSlotLost)
	case <-time.After(10 * holdFor):
		t.Fatal("the job whose slot was released was not cancelled")
	}
	jobs = e.waitFinal(t, worker, ids, time.Minute)
	require.Equal(t, rivertype.JobStateCancelled, jobs[0].State)
}

// TestUnlimitedKinds: a kind no rule names runs untouched, with no call to
// the limiter; a Key's error fails the attempt, and a job whose Key fails
// for good is retried, then discarded, having taken nothing.
func TestUnlimitedKinds(t *testing.T) {
	t.Parallel()
	const limit = "jobs"
	e := newEnv(t, map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: time.Minute}})
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[otherArgs]) error { return nil }))
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error { return nil }})
	keyErr := errors.New("no tenant")
	mw := e.middleware(t, riverlimit.Config{Rules: []riverlimit.Rule{{
		Kinds:  []string{tenantArgs{}.Kind()},
		Limits: []string{limit},
		Key: func(job *rivertype.JobRow) (string, error) {
			return "", keyErr
		},
	}}})
	worker := e.client(t, workers, 2, mw)
	res, err := worker.Insert(context.Background(), otherArgs{Tenant: "t"}, nil)
	require.NoError(t, err)
	jobs := e.waitFinal(t, worker, []int64{res.Job.ID}, time.Minute)
	require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
	require.Empty(t, e.events.of(""), "no limiter call for a kind no rule names")

	res, err = worker.Insert(context.Background(), tenantArgs{Tenant: "t"}, &river.InsertOpts{MaxAttempts: 2})
	require.NoError(t, err)
	jobs = e.waitFinal(t, worker, []int64{res.Job.ID}, time.Minute)
	require.Equal(t, rivertype.JobStateDiscarded, jobs[0].State)
	require.Len(t, jobs[0].Errors, 2)
	require.Equal(t, keyErr.Error(), jobs[0].Errors[1].Error)
	require.Empty(t, e.events.of(""), "nothing taken")
}

// TestNewInvalid: a bad Config is an *txlimit.InvalidError naming the field
// and the fix.
func TestNewInvalid(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // connects on first use: never
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"slots": {Kind: txlimit.Concurrency, Capacity: 2, HoldFor: time.Minute},
		"rate":  {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
	}, nil)
	require.NoError(t, err)
	key := riverlimit.ArgsKey(func(a tenantArgs) string { return a.Tenant })
	good := riverlimit.Rule{Kinds: []string{"k"}, Limits: []string{"slots"}, Key: key}
	for _, tc := range []struct {
		name    string
		limiter *txlimit.Limiter[pgx.Tx]
		cfg     riverlimit.Config
		limit   string
		field   string
		problem string
	}{
		{"no limiter", nil, riverlimit.Config{Rules: []riverlimit.Rule{good}}, "", "limiter", "is nil"},
		{"no rules", limiter, riverlimit.Config{}, "", "Config.Rules", "at least one Rule"},
		{"no kinds", limiter, riverlimit.Config{Rules: []riverlimit.Rule{good, {Limits: []string{"rate"}, Key: key}}},
			"", "Config.Rules[1].Kinds", "name the job kinds"},
		{"empty kind", limiter, riverlimit.Config{Rules: []riverlimit.Rule{{Kinds: []string{""}, Limits: []string{"rate"}, Key: key}}},
			"", "Config.Rules[0].Kinds", "empty kind"},
		{"no limits", limiter, riverlimit.Config{Rules: []riverlimit.Rule{{Kinds: []string{"k"}, Key: key}}},
			"", "Config.Rules[0].Limits", "name the limits"},
		{"unknown limit", limiter, riverlimit.Config{Rules: []riverlimit.Rule{{Kinds: []string{"k"}, Limits: []string{"nope"}, Key: key}}},
			"nope", "Config.Rules[0].Limits", "give it to txlimit.New"},
		{"no key", limiter, riverlimit.Config{Rules: []riverlimit.Rule{{Kinds: []string{"k"}, Limits: []string{"slots"}}}},
			"", "Config.Rules[0].Key", "is nil"},
		{"a limit twice for a kind", limiter, riverlimit.Config{Rules: []riverlimit.Rule{good,
			{Kinds: []string{"other", "k"}, Limits: []string{"rate", "slots"}, Key: key}}},
			"slots", "Config.Rules[1].Limits", `kind "k" a second time`},
		{"SlotWait", limiter, riverlimit.Config{Rules: []riverlimit.Rule{good}, SlotWait: time.Microsecond},
			"", "Config.SlotWait", "at least 1ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := riverlimit.New(tc.limiter, tc.cfg)
			require.Nil(t, mw)
			var invalid *txlimit.InvalidError
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, tc.limit, invalid.Limit)
			require.Equal(t, tc.field, invalid.Field)
			require.Contains(t, invalid.Problem, tc.problem)
		})
	}
	mw, err := riverlimit.New(limiter, riverlimit.Config{Rules: []riverlimit.Rule{good,
		{Kinds: []string{"k"}, Limits: []string{"rate"}, Key: key}}, Spread: -1})
	require.NoError(t, err, "two rules of one kind with different limits")
	require.NotNil(t, mw)
}

// TestArgsKey: ArgsKey decodes the job's arguments; arguments that do not
// decode are an error naming the job.
func TestArgsKey(t *testing.T) {
	t.Parallel()
	key := riverlimit.ArgsKey(func(a tenantArgs) string { return a.Tenant })
	k, err := key(&rivertype.JobRow{ID: 7, Kind: "tenant_job", EncodedArgs: []byte(`{"tenant":"acme","seq":3}`)})
	require.NoError(t, err)
	require.Equal(t, "acme", k)
	_, err = key(&rivertype.JobRow{ID: 8, Kind: "tenant_job", EncodedArgs: []byte(`{"tenant":3}`)})
	require.ErrorContains(t, err, `job 8 (kind "tenant_job")`)
}

// TestFailOpen: with txlimit.Options.FailOpen, a job runs when the limiter's
// database fails, holding no slot: its heartbeats do not cancel it for a
// slot it never had, however long it runs past HoldFor.
func TestFailOpen(t *testing.T) {
	t.Parallel()
	const (
		limit   = "jobs"
		holdFor = 300 * time.Millisecond
	)
	e := newEnv(t, nil)
	broken, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	broken.Close() // every call of the limiter fails
	var failedOpen atomic.Int32
	limiter, err := txlimit.New(pgstore.New(broken),
		map[string]txlimit.Config{limit: {Kind: txlimit.Concurrency, Capacity: 1, HoldFor: holdFor}},
		&txlimit.Options{FailOpen: true, Observer: func(_ context.Context, ev txlimit.Event) {
			if ev.FailedOpen {
				failedOpen.Add(1)
			}
		}})
	require.NoError(t, err)
	mw, err := riverlimit.New(limiter, riverlimit.Config{Rules: []riverlimit.Rule{tenantRule(limit)}})
	require.NoError(t, err)
	causes := make(chan error, 2)
	workers := river.NewWorkers()
	river.AddWorker(workers, &tenantWorker{work: func(ctx context.Context, job *river.Job[tenantArgs]) error {
		time.Sleep(4 * holdFor)
		causes <- context.Cause(ctx)
		return nil
	}})
	worker := e.client(t, workers, 2, mw)
	ids := insert(t, worker, tenantArgs{Tenant: "t", Seq: 0}, tenantArgs{Tenant: "t", Seq: 1})
	jobs := e.waitFinal(t, worker, ids, time.Minute)
	for _, j := range jobs {
		require.Equal(t, rivertype.JobStateCompleted, j.State)
		require.NoError(t, <-causes, "not cancelled")
	}
	require.EqualValues(t, 2, failedOpen.Load(), "both jobs ran on a failed-open acquire, beyond the capacity of 1")
}
