package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
)

// limitSpec is the limit of one run: one token bucket, which txlimit and the
// floor implement alike.
type limitSpec struct {
	// Name is unique per run, so that no run starts from another's state.
	Name     string
	Capacity float64
	Rate     float64 // tokens per Period
	Period   time.Duration
	Shards   int
	// Clock, when set, is frozen or injected for both implementations;
	// when nil txlimit reads the database clock and the floor time.Now.
	Clock func() time.Time
	// held, for the slot subjects' admission check, counts the calls
	// holding a slot, each for hold (slots.go).
	held *heldCount
	hold time.Duration
}

func (s limitSpec) config() txlimit.Config {
	return txlimit.Config{Kind: txlimit.TokenBucket, Rate: s.Rate, Period: s.Period, Capacity: s.Capacity, Shards: s.Shards}
}

// now is the floor's clock, at the microsecond precision of the stored ts.
func (s limitSpec) now() time.Time {
	if s.Clock != nil {
		return time.UnixMicro(s.Clock().UnixMicro())
	}
	return time.UnixMicro(time.Now().UnixMicro())
}

// project is the floor's token bucket: the tokens of a bucket that held
// value at ts, at now.
func (s limitSpec) project(value float64, ts, now time.Time) float64 {
	elapsed := max(now.Sub(ts), 0)
	return math.Min(value+float64(elapsed)*s.Rate/float64(s.Period), s.Capacity)
}

// shard is one shard of s, for the sharded floor: a bucket with 1/Shards of
// its rate and capacity.
func (s limitSpec) shard() limitSpec {
	n := float64(max(s.Shards, 1))
	s.Rate, s.Capacity = s.Rate/n, s.Capacity/n
	return s
}

// refill is the most a bucket of s gains in d.
func (s limitSpec) refill(d time.Duration) float64 {
	return float64(d) * s.Rate / float64(s.Period)
}

// newLimiter is a Limiter of spec on store; tune, when not nil, changes the
// Config of a variant (another mode, another setting) before it is used.
func newLimiter[TTx any](store driver.Store[TTx], spec limitSpec, tune func(*txlimit.Config)) (*txlimit.Limiter[TTx], error) {
	var opts *txlimit.Options
	if spec.Clock != nil {
		opts = &txlimit.Options{Clock: spec.Clock}
	}
	cfg := spec.config()
	if tune != nil {
		tune(&cfg)
	}
	return txlimit.New(store, map[string]txlimit.Config{spec.Name: cfg}, opts)
}

// subject is one implementation (txlimit, the floor, Redis, ...) on one
// database.
type subject interface {
	// newClient opens a client of key on a connection of its own, with the
	// key's state in place for the floor, which has no way to create it.
	// Each of the client's transactions does w before the limit step, as
	// an application does (a subject that cannot do w says so).
	newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error)
	// value reads the tokens of key now, once every client is closed.
	value(ctx context.Context, spec limitSpec, key string) (float64, error)
}

// windowed is a subject whose limit is a fixed window on its server's clock
// (Redis): Capacity calls per window of Period, the window counted by the
// server. A saturating run that spans two windows may admit twice.
type windowed interface {
	// windows is how many windows of spec's key the run touched, from the
	// first client's opening to the last value read.
	windows(spec limitSpec, key string) int
}

// client is one connection that takes one token per call, in a transaction
// of its own.
type client interface {
	take(ctx context.Context) (call, error)
	close()
}

// call is the outcome of one transaction: whether the limit admitted it, and
// how long its limit step took (the time around LimitTx, the floor's two
// statements, the Redis EVALSHA), BEGIN, business write and COMMIT left out.
type call struct {
	ok   bool
	step time.Duration
}

// workload says how the clients of one run call.
// minUntilDenied is the least time a workload with untilDenied may go on
// past its duration.
const minUntilDenied = 20 * time.Second

type workload struct {
	keys []string // the key of each client
	// duration is how long the clients call; 0 means until each is denied
	// once, or has called maxOps times.
	duration time.Duration
	maxOps   int
	// untilDenied makes the clients of a run with a duration go on past
	// it, until each has been denied once (the proof that demand exceeded
	// the limit), for up to ten times as long and at least
	// minUntilDenied: on a slow machine (or under -race) a sharded limit
	// near saturation serves few calls a second, and the clients need
	// that long to drain it.
	untilDenied bool
	// warmUp makes one untimed call per client first, which creates the
	// rows and fills the connections' statement caches.
	warmUp bool
	// work is what every transaction does beside the limit step (see
	// subject.newClient).
	work work
	// unlimited skips the value reads after the run: the subject has no
	// limit to read ("none").
	unlimited bool
	// started is called once the clients are ready, before the timed
	// calls, and finished right after them.
	started, finished func()
}

// runStats is what one run measured.
type runStats struct {
	ops, admitted int64            // timed calls, and how many were granted
	perKey        map[string]int64 // grants per key, warm-up included
	allDenied     bool             // every client was denied at least once
	elapsed       time.Duration    // of the timed calls
	span          time.Duration    // from the first call (warm-up included) to the end of value reads
	lat           []time.Duration  // of each timed call
	stepLat       []time.Duration  // of the limit step of each timed call
	values        map[string]float64
}

func (r runStats) opsPerSec() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// drive runs w against s and reads every key's tokens afterwards.
func drive(ctx context.Context, s subject, spec limitSpec, w workload) (runStats, error) {
	st := runStats{perKey: map[string]int64{}, values: map[string]float64{}}
	clients := make([]client, 0, len(w.keys))
	closeAll := func() {
		for _, c := range clients {
			c.close()
		}
		clients = nil
	}
	defer closeAll()
	first := time.Now()
	for _, key := range w.keys {
		c, err := s.newClient(ctx, spec, key, w.work)
		if err != nil {
			return st, err
		}
		clients = append(clients, c)
	}
	if w.warmUp {
		for i, c := range clients {
			r, err := c.take(ctx)
			if err != nil {
				return st, fmt.Errorf("warm-up: %w", err)
			}
			if r.ok {
				st.perKey[w.keys[i]]++
			}
		}
	}
	if w.started != nil {
		w.started()
	}

	type result struct {
		ops, admitted int64
		denied        bool
		lat, stepLat  []time.Duration
		err           error
	}
	results := make([]result, len(clients))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(w.duration)
	hardDeadline := start.Add(max(10*w.duration, minUntilDenied))
	for i, c := range clients {
		wg.Go(func() {
			r := &results[i]
			r.lat = make([]time.Duration, 0, 4096)
			r.stepLat = make([]time.Duration, 0, 4096)
			for {
				if now := time.Now(); w.duration > 0 && !now.Before(deadline) &&
					(!w.untilDenied || r.denied || !now.Before(hardDeadline)) {
					return
				}
				if w.duration == 0 && (r.denied || r.ops >= int64(w.maxOps)) {
					return
				}
				t := time.Now()
				res, err := c.take(runCtx)
				if err != nil {
					r.err = err
					cancel()
					return
				}
				r.lat = append(r.lat, time.Since(t))
				r.stepLat = append(r.stepLat, res.step)
				r.ops++
				if res.ok {
					r.admitted++
				} else {
					r.denied = true
				}
			}
		})
	}
	wg.Wait()
	st.elapsed = time.Since(start)
	if w.finished != nil {
		w.finished()
	}
	var errs []error
	st.allDenied = true
	for i, r := range results {
		if r.err != nil && (!errors.Is(r.err, context.Canceled) || ctx.Err() != nil) {
			errs = append(errs, r.err)
		}
		st.ops += r.ops
		st.admitted += r.admitted
		st.perKey[w.keys[i]] += r.admitted
		st.allDenied = st.allDenied && r.denied
		st.lat = append(st.lat, r.lat...)
		st.stepLat = append(st.stepLat, r.stepLat...)
	}
	if len(errs) > 0 {
		return st, errs[0]
	}
	closeAll()
	for _, key := range w.keys {
		if w.unlimited {
			break
		}
		if _, done := st.values[key]; done {
			continue
		}
		v, err := s.value(ctx, spec, key)
		if err != nil {
			return st, fmt.Errorf("read the tokens left: %w", err)
		}
		st.values[key] = v
	}
	st.span = time.Since(first)
	return st, nil
}

// percentile returns the p-th percentile (0 < p <= 1) of d, nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// check is one admission check and its outcome.
type check struct {
	Name   string `json:"name"`
	Detail string `json:"detail"`
	OK     bool   `json:"ok"`
}

// tolerance absorbs float64 rounding in a pooled or spread value: far below
// one token.
func tolerance(spec limitSpec) float64 { return 1e-9*spec.Capacity + 1e-9 }

// checkAllAdmitted checks a timed run on a limit too large to run out:
// every call must be granted, and every key must hold capacity minus what it
// granted, plus at most what it refilled meanwhile. A lost update leaves more
// tokens than that; a wrong denial fails the first condition.
func checkAllAdmitted(name string, spec limitSpec, st runStats) check {
	c := check{Name: name, OK: true}
	if st.admitted != st.ops {
		c.OK = false
		c.Detail = fmt.Sprintf("%d of %d calls denied, but the limit (capacity %g) cannot run out", st.ops-st.admitted, st.ops, spec.Capacity)
		return c
	}
	refill := spec.refill(st.span)
	for key, adm := range st.perKey {
		want := spec.Capacity - float64(adm)
		got := st.values[key]
		if got < want-tolerance(spec) || got > want+refill+tolerance(spec) {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q granted %d but holds %.6f tokens; want %.6f (capacity - granted) plus at most %.6f refilled", key, adm, got, want, refill)
			return c
		}
	}
	c.Detail = fmt.Sprintf("all %d calls granted; every key holds capacity - granted (+ <= %.4f refill)", st.ops, refill)
	return c
}

// checkExact checks a frozen-clock run whose clients called until denied:
// each key must have granted exactly its capacity, and hold what is left.
func checkExact(name string, spec limitSpec, st runStats) check {
	c := check{Name: name, OK: true}
	if !st.allDenied {
		c.OK = false
		c.Detail = fmt.Sprintf("a client was never denied in %d calls: demand did not exceed capacity %g, or the limit admits too much", st.ops, spec.Capacity)
		return c
	}
	var total int64
	for key, adm := range st.perKey {
		total += adm
		if float64(adm) != spec.Capacity {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q granted %d on a frozen clock; want exactly its capacity %g", key, adm, spec.Capacity)
			return c
		}
		if left := st.values[key]; math.Abs(left-(spec.Capacity-float64(adm))) > tolerance(spec) {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q holds %.6f tokens after granting all %d; want %.6f", key, left, adm, spec.Capacity-float64(adm))
			return c
		}
	}
	c.Detail = fmt.Sprintf("%d keys: each granted exactly %g of %d calls in all (%.0f calls/s)", len(st.perKey), spec.Capacity, st.ops, st.opsPerSec())
	return c
}

// checkBounded checks a real-clock run whose clients called without pause
// until each was denied: each key must have granted at most capacity + rate *
// elapsed, and at least its capacity, since a denial means that the limit had
// less than one token left.
func checkBounded(name string, spec limitSpec, st runStats) check {
	c := check{Name: name, OK: true}
	if !st.allDenied {
		c.OK = false
		c.Detail = fmt.Sprintf("a client was never denied in %d calls over %v: the limit (capacity %g, %g/s) admits too much, or the machine is too slow for the check",
			st.ops, st.span.Round(time.Millisecond), spec.Capacity, spec.refill(time.Second))
		return c
	}
	most := spec.Capacity + spec.refill(st.span) + tolerance(spec)
	lo, hi := int64(math.MaxInt64), int64(0)
	for key, adm := range st.perKey {
		lo, hi = min(lo, adm), max(hi, adm)
		if float64(adm) < spec.Capacity || float64(adm) > most {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q granted %d in %v; want between capacity %g and capacity + rate*elapsed = %.1f",
				key, adm, st.span.Round(time.Millisecond), spec.Capacity, most)
			return c
		}
	}
	c.Detail = fmt.Sprintf("%d keys granted %d..%d of %d calls (%.0f calls/s); bound [%g, %.1f] (capacity + rate*%v)",
		len(st.perKey), lo, hi, st.ops, st.opsPerSec(), spec.Capacity, most, st.span.Round(time.Millisecond))
	return c
}

// checkWindow checks a run of a windowed subject whose clients called until
// denied: each key must have granted exactly its capacity when the run stayed
// in one window, and between capacity and capacity per window touched when it
// crossed into the next; and the server must have counted every call,
// granted or denied (the script increments before it decides), so the
// counters add up to the calls made.
func checkWindow(name string, spec limitSpec, st runStats, windows map[string]int) check {
	c := check{Name: name, OK: true}
	if !st.allDenied {
		c.OK = false
		c.Detail = fmt.Sprintf("a client was never denied in %d calls: demand did not exceed %g a window, or the limit admits too much", st.ops, spec.Capacity)
		return c
	}
	crossed := 0
	for key, adm := range st.perKey {
		n := max(windows[key], 1)
		if n > 1 {
			crossed++
		}
		if float64(adm) < spec.Capacity || float64(adm) > spec.Capacity*float64(n) || (n == 1 && float64(adm) != spec.Capacity) {
			c.OK = false
			c.Detail = fmt.Sprintf("key %q granted %d over %d window(s) of %v; want exactly %g in one window, at most %g a window", key, adm, n, spec.Period, spec.Capacity, spec.Capacity)
			return c
		}
	}
	var counted float64
	for _, v := range st.values {
		counted += spec.Capacity - v
	}
	if counted != float64(st.ops) {
		c.OK = false
		c.Detail = fmt.Sprintf("the counters add up to %.0f calls, but %d were made", counted, st.ops)
		return c
	}
	c.Detail = fmt.Sprintf("%d keys: each granted %g a window of %d calls in all (%.0f calls/s), every call counted", len(st.perKey), spec.Capacity, st.ops, st.opsPerSec())
	if crossed > 0 {
		c.Detail += fmt.Sprintf("; %d key(s) crossed into a new window", crossed)
	}
	return c
}
