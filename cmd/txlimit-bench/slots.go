package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

// The concurrency slots (issue 33): a slot acquired in the business
// transaction and released once it has committed, each call, against the
// semaphore users run on Redis beside the transaction today.
const (
	// implSlot acquires a slot of a txlimit.Concurrency limit with LimitTx
	// in the business transaction (BEGIN; INSERT …; LimitTx; COMMIT) and
	// releases it with ReleaseTx in the next transaction, on the same
	// connection, once the work the slot guards is done: here at once.
	implSlot = "txlimit/slot"
	// implRedisSemaphore is the sorted-set semaphore beside the
	// transaction: BEGIN; INSERT …; EVALSHA (acquire); COMMIT; ZREM.
	implRedisSemaphore = "redis/semaphore"
)

// slotHoldFor is the HoldFor of the slots: far longer than a run, so that
// no slot expires while it is held.
const slotHoldFor = time.Minute

// slotCapacity is the slots of the hot key in the admission check: fewer
// than the clients, so that they contend.
const slotCapacity = 3

// semaphoreScript is the Redis semaphore: a sorted set per key whose
// members are the holders, scored by their expiry in milliseconds on
// Redis's clock. It drops the expired holders, counts the rest, and adds
// the caller when fewer than the capacity hold a slot. KEYS[1] is the set,
// ARGV[1] the capacity, ARGV[2] the hold in milliseconds, ARGV[3] the
// holder. It answers 1 when the slot was acquired, 0 when the set is full.
// The release is ZREM.
const semaphoreScript = `
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
`

// slotsOf are the slot scenarios: the business transaction on distinct
// keys and on one hot key.
func slotsOf() []scenario {
	return []scenario{{name: "slots", shards: 1, work: orderWork, slots: true},
		{name: "slots-hot", hot: true, shards: 1, work: orderWork, slots: true}}
}

// slotChecks is the admission check of the slot subjects: on the hot key,
// at most slotCapacity held at once. (On distinct keys each client has a
// key of its own, and no two ever contend.)
func slotChecks(s scenario) []saturation {
	if !s.hot {
		return nil
	}
	return []saturation{heldAtOnce}
}

// slotSpec is the limit of the admission check: slotCapacity slots, and a
// count of the calls holding one, each for slotHold.
func slotSpec(name string) limitSpec {
	return limitSpec{Name: name, Capacity: slotCapacity, Shards: 1, held: &heldCount{}, hold: slotHold}
}

// slotHold is how long a call of the admission check holds its slot before
// it releases it: long beside an acquire, so that the slots fill and every
// client is denied even where the acquires of the hot key, which queue on
// its lock row until their COMMIT, take 30ms each (a loaded 2-CPU machine:
// at 50ms, 3 slots were seldom held at once, and a client of 8 went 20s
// without a denial).
const slotHold = 300 * time.Millisecond

// slotCheckFor is how long the clients of the admission check call: a few
// holds.
const slotCheckFor = 2 * time.Second

// heldCount counts the calls that hold a slot: from the commit of their
// acquire until their release starts, when their slot is surely held.
type heldCount struct {
	now, most atomic.Int64
}

func (h *heldCount) enter() {
	n := h.now.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (h *heldCount) leave() { h.now.Add(-1) }

// slotClient is a client of a slot subject: the business transaction with
// the acquire as its step, and after its COMMIT the release (free), both
// timed as the step.
type slotClient struct {
	*pgClient
	spec limitSpec
	free func(ctx context.Context) error
}

func (c *slotClient) take(ctx context.Context) (call, error) {
	r, err := c.pgClient.take(ctx)
	if err != nil || !r.ok {
		return r, err
	}
	if h := c.spec.held; h != nil {
		h.enter()
		time.Sleep(c.spec.hold)
		h.leave()
	}
	start := time.Now()
	err = c.free(ctx)
	r.step += time.Since(start)
	return r, err
}

// pgSlot is txlimit's slot on pgstore.
type pgSlot struct{ p *pgPool }

func (s pgSlot) limiter(spec limitSpec) (*txlimit.Limiter[pgx.Tx], error) {
	return newLimiter(pgstore.New(s.p.pool), spec, func(c *txlimit.Config) {
		*c = txlimit.Config{Kind: txlimit.Concurrency, Capacity: spec.Capacity, HoldFor: slotHoldFor}
	})
}

func (s pgSlot) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	l, err := s.limiter(spec)
	if err != nil {
		return nil, err
	}
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	var holder string
	c := &slotClient{spec: spec, pgClient: newPgClient(conn, key, w, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		res, err := l.LimitTx(ctx, tx, spec.Name, key)
		holder = res.Holder
		return res.OK, err
	})}
	c.free = func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			released, err := l.ReleaseTx(ctx, tx, spec.Name, key, holder)
			if err == nil && !released {
				err = fmt.Errorf("holder %s of key %q was not live at its release", holder, key)
			}
			return err
		})
	}
	return c, nil
}

// value is the free slots of key.
func (s pgSlot) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	l, err := s.limiter(spec)
	if err != nil {
		return 0, err
	}
	res, err := l.Check(ctx, spec.Name, key, txlimit.Count(0))
	return res.Remaining, err
}

// redisSemaphore is the sorted-set semaphore beside the business
// transaction on PostgreSQL.
type redisSemaphore struct {
	env *redisEnv
	p   *pgPool
}

// holders numbers the holders of the Redis semaphore in a run.
var holders atomic.Int64

func (s redisSemaphore) newClient(ctx context.Context, spec limitSpec, key string, wk work) (client, error) {
	if spec.Clock != nil {
		return nil, errors.New("the Redis semaphore reads Redis's clock: it cannot run on an injected one")
	}
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rc := s.env.rdb.Conn()
	k := s.env.key(spec, key)
	args := []any{int64(spec.Capacity), slotHoldFor.Milliseconds(), ""}
	var holder string
	pc := newPgClient(conn, key, wk, func(ctx context.Context, _ pgx.Tx) (bool, error) {
		holder = strconv.FormatInt(holders.Add(1), 10)
		args[2] = holder
		n, err := s.env.semaphore.Run(ctx, rc, []string{k}, args...).Int64()
		return n == 1, err
	})
	pc.release = func() { _ = rc.Close() }
	c := &slotClient{spec: spec, pgClient: pc}
	c.free = func(ctx context.Context) error {
		n, err := rc.ZRem(ctx, k, holder).Result()
		if err == nil && n != 1 {
			err = fmt.Errorf("holder %s of key %q was not in the set at its release", holder, key)
		}
		return err
	}
	return c, nil
}

// value is the free slots of key: the capacity less the holders whose
// expiry has not passed on Redis's clock.
func (s redisSemaphore) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	now, err := s.env.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	n, err := s.env.rdb.ZCount(ctx, s.env.key(spec, key), strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
	return spec.Capacity - float64(n), err
}

// checkAllReleased checks a timed run of a slot subject on a capacity too
// large to run out: every call must be granted, and every key must have
// every slot free again, each call having released its own.
func checkAllReleased(name string, spec limitSpec, st runStats) check {
	c := check{Name: name, OK: true}
	if st.admitted != st.ops {
		c.OK = false
		c.Detail = fmt.Sprintf("%d of %d calls denied, but the limit (capacity %g) cannot run out", st.ops-st.admitted, st.ops, spec.Capacity)
		return c
	}
	for key := range st.perKey {
		if got := st.values[key]; got != spec.Capacity {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q has %g free slots after every call released its own; want all %g", key, got, spec.Capacity)
			return c
		}
	}
	c.Detail = fmt.Sprintf("all %d calls granted and released; every key has all its slots free", st.ops)
	return c
}

// checkHeld checks a real-clock run whose clients acquired and released the
// slots of one key for slotCheckFor: some call must have been denied, the
// calls holding a slot at once (counted between the acquire's commit and the
// release) must have reached the capacity and never exceeded it, and every
// slot must be free at the end. (Not every client need be denied: one that
// releases its slot may win it back at once, again and again.)
func checkHeld(name string, spec limitSpec, st runStats) check {
	c := check{Name: name, OK: true}
	most := spec.held.most.Load()
	switch {
	case st.admitted == st.ops:
		c.OK = false
		c.Detail = fmt.Sprintf("no call of %d was denied (at most %d held a slot at once): demand did not exceed %g slots, or the limit admits too many", st.ops, most, spec.Capacity)
	case float64(most) > spec.Capacity:
		c.OK = false
		c.Detail = fmt.Sprintf("%d calls held a slot at once; the capacity is %g", most, spec.Capacity)
	case float64(most) < spec.Capacity:
		c.OK = false
		c.Detail = fmt.Sprintf("at most %d calls held a slot at once in %d calls: the run never filled the %g slots", most, st.ops, spec.Capacity)
	}
	if !c.OK {
		return c
	}
	for key, v := range st.values {
		if v != spec.Capacity {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q has %g free slots at the end; want all %g", key, v, spec.Capacity)
			return c
		}
	}
	c.Detail = fmt.Sprintf("%d of %d calls granted (%.0f calls/s); at most %d held a slot at once, the capacity", st.admitted, st.ops, st.opsPerSec(), most)
	return c
}
