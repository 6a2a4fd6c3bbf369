package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

// The subjects of the take at commit and of the peer it is measured
// against.
const (
	// txlimit's take at commit (Limiter.Commit on pgstore): the
	// business transaction whose COMMIT carries the take.
	implCommit = "txlimit/commit"
	// The same with Config.Lease: the setup docs/commit.md recommends for
	// a hot key.
	implCommitLease = "txlimit/commit+lease"
	// txlimit's take in the caller's batch (pgstore.SendBatch):
	// the business transaction whose INSERT is queued after the take.
	implBatch = "txlimit/batch"
	// github.com/go-redis/redis_rate/v10 (GCRA, one EVALSHA) beside the
	// transaction, as the Redis step is.
	implRedisRate = "redis_rate"
)

// pgCommit is the business transaction through Limiter.Commit: BEGIN,
// the INSERT of an order, and the take sent with the COMMIT in one
// pipeline. Each call acquires its connection from the pool, as Commit
// does, where the other subjects' clients hold one for the run; the pool
// has one a client (a lease taken ahead waits for one). With lease set the
// limit has Config.Lease (leaseSize, or a quarter of a smaller capacity)
// and LeaseAhead half of it, and the clients of a limit share one Limiter,
// as the goroutines of one process do, so that they share its leases.
type pgCommit struct {
	p     *pgPool
	lease bool
	// limiters are the Limiters of the limits, one each, shared by their
	// clients.
	limiters *sync.Map
}

// leaseSize is the lease of the timed runs: 64 calls' tokens a lease.
const leaseSize = 64

// leaseFor is the LeaseFor of the timed runs' leases: longer than a cell.
const leaseFor = 30 * time.Second

func newPgCommit(p *pgPool, lease bool) pgCommit {
	return pgCommit{p: p, lease: lease, limiters: &sync.Map{}}
}

func (s pgCommit) limiter(spec limitSpec) (*txlimit.Limiter[pgx.Tx], error) {
	if l, ok := s.limiters.Load(spec.Name); ok {
		return l.(*txlimit.Limiter[pgx.Tx]), nil
	}
	var tune func(*txlimit.Config)
	if s.lease {
		tune = func(c *txlimit.Config) {
			c.Lease = min(leaseSize, math.Floor(spec.Capacity/4))
			c.LeaseAhead = c.Lease / 2
			// A lease's unspent tokens are dropped once it outlives
			// LeaseFor (by design: a later credit could over-admit), which
			// a commit stalled for the default second on this machine can
			// make happen, and the cell's exact ledger would then count
			// them as lost. Cells last seconds: a lease outlives none.
			c.LeaseFor = leaseFor
		}
	}
	l, err := newLimiter(pgstore.New(s.p.pool), spec, tune)
	if err != nil {
		return nil, err
	}
	got, _ := s.limiters.LoadOrStore(spec.Name, l)
	return got.(*txlimit.Limiter[pgx.Tx]), nil
}

func (s pgCommit) newClient(_ context.Context, spec limitSpec, key string, w work) (client, error) {
	l, err := s.limiter(spec)
	if err != nil {
		return nil, err
	}
	return &commitClient{l: l, req: txlimit.Request{Name: spec.Name, Key: key}, work: newPgWork(w, key)}, nil
}

// value is the limit's tokens with those parked in the Limiter's lease,
// taken from the limit but not handed out.
func (s pgCommit) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	l, err := s.limiter(spec)
	if err != nil {
		return 0, err
	}
	read, err := l.Check(ctx, spec.Name, key, txlimit.Count(0))
	return read.Remaining + read.Leased, err
}

type commitClient struct {
	l    *txlimit.Limiter[pgx.Tx]
	req  txlimit.Request
	work *pgWork
}

// take is one business transaction. Its step is the time from the end of
// the work to Commit's return: the takes and the COMMIT, in one round
// trip, where the other subjects' step leaves the COMMIT out.
func (c *commitClient) take(ctx context.Context) (call, error) {
	var workDone time.Time
	_, err := c.l.Commit(ctx, func(tx pgx.Tx) error {
		if err := c.work.do(ctx, tx); err != nil {
			return err
		}
		workDone = time.Now()
		return nil
	}, c.req)
	r := call{ok: err == nil, step: time.Since(workDone)}
	if errors.Is(err, txlimit.ErrRateLimited) {
		err = nil
	}
	return r, err
}

func (c *commitClient) close() {}

// pgBatch is the business transaction through pgstore.SendBatch: BEGIN,
// one batch of the take and the work's first statement (the INSERT of an
// order; the tpcb-like transaction's UPDATE of its account), the rest of
// the work, COMMIT (a denial has rolled the transaction back). Each client
// holds a connection of its own for the run, as LimitTx's do.
type pgBatch struct{ p *pgPool }

func (s pgBatch) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	l, err := newLimiter(pgstore.New(s.p.pool), spec, nil)
	if err != nil {
		return nil, err
	}
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &batchClient{conn: conn, l: l, req: txlimit.Request{Name: spec.Name, Key: key}, work: newPgWork(w, key)}, nil
}

func (s pgBatch) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	return pgLimit{p: s.p, store: pgstore.New(s.p.pool)}.value(ctx, spec, key)
}

type batchClient struct {
	conn *pgxpool.Conn
	l    *txlimit.Limiter[pgx.Tx]
	req  txlimit.Request
	work *pgWork
}

// take is one business transaction. Its step is SendBatch: the take and
// the work's first statement in one round trip, where the other subjects'
// step leaves the work out.
func (c *batchClient) take(ctx context.Context) (call, error) {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		return call{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	then := c.work.batched(b)
	start := time.Now()
	_, err = pgstore.SendBatch(ctx, c.l, tx, b, c.req)
	r := call{ok: err == nil, step: time.Since(start)}
	switch {
	case errors.Is(err, txlimit.ErrRateLimited):
		return r, nil
	case err != nil:
		return r, err
	}
	if err := then(ctx, tx); err != nil {
		return r, err
	}
	return r, tx.Commit(ctx)
}

func (c *batchClient) close() { c.conn.Release() }

// redisRate is redis_rate's GCRA limiter on Redis beside the business
// transaction: the step is one Allow (an EVALSHA of its script). Its limit
// is the spec's token bucket as redis_rate spells one (whole events per
// Period): Burst the capacity, one event per Period/Rate.
type redisRate struct {
	env *redisEnv
	p   *pgPool
}

func (s redisRate) limit(spec limitSpec) (redis_rate.Limit, error) {
	switch {
	case spec.Clock != nil:
		return redis_rate.Limit{}, errors.New("redis_rate reads Redis's clock: it cannot run on an injected one")
	case spec.Capacity != float64(int(spec.Capacity)) || spec.Capacity < 1:
		return redis_rate.Limit{}, fmt.Errorf("redis_rate's burst is a whole number of events, got capacity %v", spec.Capacity)
	}
	return redis_rate.Limit{Rate: 1, Burst: int(spec.Capacity), Period: time.Duration(float64(spec.Period) / spec.Rate)}, nil
}

func (s redisRate) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	lim, err := s.limit(spec)
	if err != nil {
		return nil, err
	}
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rc := s.env.rdb.Conn()
	limiter, k := redis_rate.NewLimiter(rc), s.env.key(spec, key)
	c := newPgClient(conn, key, w, func(ctx context.Context, _ pgx.Tx) (bool, error) {
		res, err := limiter.Allow(ctx, k, lim)
		if err != nil {
			return false, err
		}
		return res.Allowed == 1, nil
	})
	c.release = func() { _ = rc.Close() }
	return c, nil
}

// value is what redis_rate says remains: the whole events it would admit
// now (AllowN of 0 takes nothing).
func (s redisRate) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	lim, err := s.limit(spec)
	if err != nil {
		return 0, err
	}
	res, err := redis_rate.NewLimiter(s.env.rdb).AllowN(ctx, s.env.key(spec, key), lim, 0)
	if err != nil {
		return 0, err
	}
	return float64(res.Remaining), nil
}
