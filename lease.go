package txlimit

import (
	"context"
	"sync"
	"time"

	"github.com/txlimit/txlimit/driver"
)

// defaultLeaseFor is how long a lease lasts when Config.LeaseFor is 0.
const defaultLeaseFor = time.Second

// leases are the leases a Limiter holds (Config.Lease), one per (name,
// key) at most.
type leases struct {
	mu sync.Mutex
	m  map[driver.KeyRef]*lease
}

// lease is the tokens of one (name, key) this Limiter took from the limit
// and hands out from memory to the commit forms.
type lease struct {
	mu     sync.Mutex
	tokens float64
	// until is when the lease ends, on this process's clock: LeaseFor
	// after it was taken, or earlier, at the end of the window its tokens
	// were taken in.
	until time.Time
	// returnBy is until for a TokenBucket, the end of the window for a
	// FixedWindow: its unspent tokens go back to the limit before then,
	// and are dropped after (returnTokens).
	returnBy time.Time
	// config is what the tokens were taken under, for their return.
	config Config
	// gen counts the leases taken: a token handed out under one lease
	// goes back to it only while it lasts.
	gen uint64
}

func (ls *leases) get(k driver.KeyRef) *lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.m == nil {
		ls.m = map[driver.KeyRef]*lease{}
	}
	le := ls.m[k]
	if le == nil {
		le = &lease{}
		ls.m[k] = le
	}
	return le
}

// all is every lease, for ReturnLeases.
func (ls *leases) all() map[driver.KeyRef]*lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := make(map[driver.KeyRef]*lease, len(ls.m))
	for k, le := range ls.m {
		out[k] = le
	}
	return out
}

// leased is a token (or Count tokens) handed out from a lease to one call.
type leased struct {
	le       *lease
	gen      uint64
	count    float64
	returnBy time.Time // the lease's
}

// fromLease hands r's tokens out of its key's lease, taking a new lease
// when the one held is over or lacks them: up to max(Lease, r.count)
// tokens in a short transaction of the Limiter's own. When the limit does
// not have r.count tokens, res is the denial (OK false), with the wait
// Check gives.
func (l *Limiter[TTx]) fromLease(ctx context.Context, r request) (res Result, got leased, err error) {
	le := l.leases.get(driver.KeyRef{Name: r.name, Key: r.key})
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.tokens < r.count || !l.leaseNow().Before(le.until) {
		if err := l.endLease(ctx, r.name, r.key, le); err != nil {
			return Result{}, leased{}, err
		}
		if res, err = l.takeLease(ctx, r, le); err != nil || !res.OK {
			return res, leased{}, err
		}
	}
	le.tokens -= r.count
	res = Result{Name: r.name, Key: r.key, Count: r.count, Taken: r.count, OK: true, At: l.leaseNow(), Partial: true}
	return res, leased{le: le, gen: le.gen, count: r.count, returnBy: le.returnBy}, nil
}

// takeLease takes a new lease for r into le, whose tokens are 0: up to
// max(Lease, r.count) tokens. Fewer than r.count is a denial, and what was
// taken goes back at once.
func (l *Limiter[TTx]) takeLease(ctx context.Context, r request, le *lease) (Result, error) {
	want := max(r.config.Lease, r.count)
	p := r.take()
	p.Count, p.UpTo, p.Reserve, p.Escrow, p.ReadAll = want, true, false, false, false
	before := l.leaseNow()
	t, err := in(ctx, l, nil, false, func(tx TTx) (driver.TakeResult, error) { return l.store.Take(ctx, tx, p) })
	if err != nil {
		return Result{}, err
	}
	r.obs.addLockWait(t.LockWait)
	le.gen++
	if t.Taken < r.count {
		if t.Taken > 0 {
			if err := l.creditIn(ctx, nil, r.name, r.key, t.Taken, []Option{Inline(r.config)}); err != nil {
				return Result{}, err
			}
		}
		// The denial, with the wait the limit gives r itself. Tokens that
		// came back since the take (another process's credit) may make
		// Check grant: the call is still denied, having taken nothing,
		// with RetryAfter 0.
		res, err := in(ctx, l, nil, true, func(tx TTx) (Result, error) { return l.check(ctx, tx, r) })
		res.OK, res.Taken = false, 0
		return res, err
	}
	le.tokens, le.config = t.Taken, r.config
	le.until = before.Add(r.config.LeaseFor)
	le.returnBy = le.until
	if r.config.Kind == FixedWindow {
		// Its tokens are this window's: they are handed out and given
		// back in it, its end measured from before the take on this
		// clock, so never after it.
		le.returnBy = before.Add(windowEnd(r, t.At).Sub(t.At))
		le.until = minTime(le.until, le.returnBy)
	}
	return Result{OK: true}, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// leaseNow is the clock leases last on: this process's, or Options.Clock
// when a test sets it, so that a lease ends with the window the test's
// clock leaves.
func (l *Limiter[TTx]) leaseNow() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now()
}

// windowEnd is the end of the window of Period that at is in, for r's
// limit.
func windowEnd(r request, at time.Time) time.Time {
	period, origin := r.config.Period.Microseconds(), r.limit.Origin
	us := at.UnixMicro() - origin
	start := us - ((us%period)+period)%period
	return time.UnixMicro(origin + start + period)
}

// endLease gives le's tokens back to the limit (returnTokens) and empties
// it.
func (l *Limiter[TTx]) endLease(ctx context.Context, name, key string, le *lease) error {
	if err := l.returnTokens(ctx, name, key, le.config, le.tokens, le.returnBy); err != nil {
		return err
	}
	le.tokens, le.until, le.returnBy = 0, time.Time{}, time.Time{}
	le.gen++
	return nil
}

// giveBack returns the tokens of a call whose transaction did not commit
// to the lease they came from, or, when it has ended since, to the limit.
func (l *Limiter[TTx]) giveBack(ctx context.Context, r request, got leased) error {
	got.le.mu.Lock()
	defer got.le.mu.Unlock()
	if got.gen == got.le.gen {
		got.le.tokens += got.count
		return nil
	}
	return l.returnTokens(ctx, r.name, r.key, r.config, got.count, got.returnBy)
}

// returnTokens gives n unspent tokens of a lease back to the limit (Credit)
// before returnBy, and drops them after: a token bucket's are spent or given
// back within LeaseFor of being taken, a FixedWindow's within the window
// they were taken in. A credit later would add tokens that the bucket's
// Capacity, or the window's end, would have cut meanwhile, and the limit
// could admit more than it would without leases.
func (l *Limiter[TTx]) returnTokens(ctx context.Context, name, key string, c Config, n float64, returnBy time.Time) error {
	if n <= 0 || !l.leaseNow().Before(returnBy) {
		return nil
	}
	return l.creditIn(ctx, nil, name, key, n, []Option{Inline(c)})
}

// Leased is the tokens of (name, key) that this Limiter holds in a lease
// (Config.Lease): taken from the limit and not yet handed out.
func (l *Limiter[TTx]) leased(name, key string) float64 {
	l.leases.mu.Lock()
	le := l.leases.m[driver.KeyRef{Name: name, Key: key}]
	l.leases.mu.Unlock()
	if le == nil {
		return 0
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.tokens
}

// ReturnLeases ends every lease the Limiter holds (Config.Lease), each in a
// short transaction of its own, giving their unspent tokens back to their
// limits (those of a lease past its time are dropped, as at its next
// call): call it when the process stops, so that the tokens are not lost
// with it. A lease taken afterwards works as before. It returns the first
// error and leaves that lease as it was.
func (l *Limiter[TTx]) ReturnLeases(ctx context.Context) error {
	for k, le := range l.leases.all() {
		le.mu.Lock()
		err := l.endLease(ctx, k.Name, k.Key, le)
		le.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// leaseProblem is what is wrong with c's Lease, or "".
func (c Config) leaseProblem() string {
	switch {
	case c.Lease == 0:
		return ""
	case !finite(c.Lease) || c.Lease < 0:
		return "must be a finite number of tokens >= 0 (0: no lease)"
	case c.Lease > c.Capacity:
		return "exceeds Capacity: a lease takes at most what the limit holds"
	case c.Escrow:
		return "does not combine with Escrow, which keeps the row free in another way"
	case c.Kind == SlidingWindow || c.Calendar != 0:
		return "applies to TokenBucket and FixedWindow windows of Period, whose tokens a lease can hold"
	}
	return ""
}
