package txlimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
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
// and hands out from memory to the commit forms: the slice it hands out
// from and, with Config.LeaseAhead, at most one more taken ahead. Each
// slice keeps its own times, so that a token is spent or given back within
// the time of the take it came from.
type lease struct {
	mu sync.Mutex
	// cur is the slice handed out from; next the one taken ahead, which
	// replaces it when it is spent or over.
	cur, next slice
	// ahead is the take of next in flight, nil when there is none: there
	// is at most one take of a lease at a time, and next is empty while it
	// runs.
	ahead *takeAhead
	// gens counts the slices taken, for their gen.
	gens uint64
}

// slice is the tokens of one take of a lease; the zero slice is none.
type slice struct {
	tokens float64
	// until is when the slice ends, on this process's clock: LeaseFor
	// after it was taken, or earlier, at the end of the window its tokens
	// were taken in.
	until time.Time
	// returnBy is until for a TokenBucket, the end of the window for a
	// FixedWindow: its unspent tokens go back to the limit before then,
	// and are dropped after (returnTokens).
	returnBy time.Time
	// config is what the tokens were taken under, for their return.
	config Config
	// gen names the take, never 0: a token handed out from a slice goes
	// back to it only while it lasts.
	gen uint64
}

// serves says whether s can hand out count tokens at now.
func (s *slice) serves(count float64, now time.Time) bool {
	return s.tokens >= count && now.Before(s.until)
}

// takeAhead is a take of the next slice in the background.
type takeAhead struct {
	done   chan struct{} // closed when it has landed in lease.next, or failed
	cancel context.CancelFunc
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

// settle waits until no lease of k is being taken, so that a read of the
// limit's row and of the lease's tokens agree (Check).
func (ls *leases) settle(ctx context.Context, k driver.KeyRef) error {
	ls.mu.Lock()
	le := ls.m[k]
	ls.mu.Unlock()
	if le == nil {
		return nil
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.awaitAhead(ctx, false)
}

// leased is a token (or Count tokens) handed out from a lease to one call.
type leased struct {
	le       *lease
	gen      uint64 // the slice's
	count    float64
	returnBy time.Time // the slice's
}

// fromLease hands r's tokens out of its key's lease. When the slice held
// is over or lacks them, it is ended and the slice taken ahead replaces it
// (waiting for it when its take is in flight), or else a new one is taken
// here: up to max(Lease, r.count) tokens in a short transaction of the
// Limiter's own. When the limit does not have r.count tokens, res is the
// denial (OK false), with the wait Check gives. With LeaseAhead, a slice
// left with fewer than LeaseAhead tokens has the next one taken in the
// background, so that its callers do not wait for it.
func (l *Limiter[TTx]) fromLease(ctx context.Context, r request) (res Result, got leased, err error) {
	le := l.leases.get(driver.KeyRef{Name: r.name, Key: r.key})
	le.mu.Lock()
	defer le.mu.Unlock()
	for !le.cur.serves(r.count, l.leaseNow()) {
		if err := l.endSlice(ctx, r.name, r.key, &le.cur); err != nil {
			return Result{}, leased{}, err
		}
		if le.next.gen != 0 {
			le.cur, le.next = le.next, slice{}
			continue
		}
		if le.ahead != nil {
			if err := le.awaitAhead(ctx, false); err != nil {
				return Result{}, leased{}, err
			}
			continue
		}
		if res, err = l.takeLease(ctx, r, le); err != nil || !res.OK {
			return res, leased{}, err
		}
		break // a slice just taken serves, however long its take lasted
	}
	le.cur.tokens -= r.count
	if le.cur.tokens < r.config.LeaseAhead && le.next.gen == 0 && le.ahead == nil {
		l.startTakeAhead(ctx, r, le)
	}
	res = Result{Name: r.name, Key: r.key, Count: r.count, Taken: r.count, OK: true, At: l.leaseNow(), Partial: true}
	return res, leased{le: le, gen: le.cur.gen, count: r.count, returnBy: le.cur.returnBy}, nil
}

// takeLease takes a new slice for r into le.cur, which is empty: up to
// max(Lease, r.count) tokens. Fewer than r.count is a denial, and what was
// taken goes back at once.
func (l *Limiter[TTx]) takeLease(ctx context.Context, r request, le *lease) (Result, error) {
	s, err := l.takeSlice(ctx, r, max(r.config.Lease, r.count))
	if err != nil {
		return Result{}, err
	}
	if s.tokens < r.count {
		if s.tokens > 0 {
			if err := l.creditIn(ctx, nil, r.name, r.key, s.tokens, []Option{Inline(r.config)}); err != nil {
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
	le.gens++
	s.gen = le.gens
	le.cur = s
	return Result{OK: true}, nil
}

// takeSlice takes up to want tokens of r's limit in a short transaction of
// the Limiter's own, as a slice lasting LeaseFor from before the take, and
// a FixedWindow's no longer than the window they were taken in. Its gen is
// the caller's to set.
func (l *Limiter[TTx]) takeSlice(ctx context.Context, r request, want float64) (slice, error) {
	p := r.take()
	p.Count, p.UpTo, p.Reserve, p.ReadAll = want, true, false, false
	before := l.leaseNow()
	t, err := in(ctx, l, nil, false, func(tx TTx) (driver.TakeResult, error) { return l.store.Take(ctx, tx, p) })
	if err != nil {
		return slice{}, err
	}
	r.obs.addLockWait(t.LockWait)
	s := slice{tokens: t.Taken, config: r.config, until: before.Add(r.config.LeaseFor)}
	s.returnBy = s.until
	if r.config.Kind == FixedWindow {
		// Its tokens are this window's: they are handed out and given
		// back in it, its end measured from before the take on this
		// clock, so never after it.
		period := r.config.Period.Microseconds()
		end := time.UnixMicro(algo.WindowStart(r.limit.Origin, period, t.At.UnixMicro()) + period)
		s.returnBy = before.Add(end.Sub(t.At))
		if s.returnBy.Before(s.until) {
			s.until = s.returnBy
		}
	}
	return s, nil
}

// startTakeAhead takes le's next slice in the background (LeaseAhead),
// le.mu held: up to Lease tokens, in a context of its own that the
// caller's ending does not cancel (other callers will hand its tokens
// out), bounded by LeaseFor, past which the slice would be over on
// landing. A take that fails is reported to the Observer (Op
// "lease_ahead") and otherwise ignored: the call that finds the lease
// empty takes one itself.
func (l *Limiter[TTx]) startTakeAhead(ctx context.Context, r request, le *lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.config.LeaseFor)
	ahead := &takeAhead{done: make(chan struct{}), cancel: cancel}
	le.ahead = ahead
	r.count, r.obs = r.config.Lease, l.observe() // the caller's observation is not this take's
	go func() {
		defer close(ahead.done)
		defer cancel()
		s, err := l.takeSlice(ctx, r, r.count)
		if err != nil {
			l.report(ctx, r.obs, opLeaseAhead, r, Result{}, err, false)
		}
		le.mu.Lock()
		defer le.mu.Unlock()
		le.ahead = nil
		if err == nil && s.tokens > 0 {
			le.gens++
			s.gen = le.gens
			le.next = s
		}
	}()
}

// awaitAhead waits, le.mu held, until le has no take ahead in flight,
// unlocking le.mu meanwhile. When ctx ends first it returns ctx's error,
// having cancelled the take and waited for it to end when cancel is set.
func (le *lease) awaitAhead(ctx context.Context, cancel bool) error {
	for le.ahead != nil {
		ahead := le.ahead
		le.mu.Unlock()
		select {
		case <-ahead.done:
		case <-ctx.Done():
			if cancel {
				ahead.cancel()
				<-ahead.done
			}
		}
		le.mu.Lock()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
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

// endSlice gives s's tokens back to the limit (returnTokens) and empties
// it: the tokens handed out from it go back to the limit from now on.
func (l *Limiter[TTx]) endSlice(ctx context.Context, name, key string, s *slice) error {
	if err := l.returnTokens(ctx, name, key, s.config, s.tokens, s.returnBy); err != nil {
		return err
	}
	*s = slice{}
	return nil
}

// giveBack returns the tokens of a call whose transaction did not commit
// to the slice they came from, or, when it has ended since, to the limit.
func (l *Limiter[TTx]) giveBack(ctx context.Context, r request, got leased) error {
	got.le.mu.Lock()
	defer got.le.mu.Unlock()
	if got.gen == got.le.cur.gen {
		got.le.cur.tokens += got.count
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
	return le.cur.tokens + le.next.tokens
}

// ReturnLeases ends every lease the Limiter holds (Config.Lease), each in a
// short transaction of its own, giving their unspent tokens back to their
// limits (those of a lease past its time are dropped, as at its next
// call): call it when the process stops, so that the tokens are not lost
// with it. A lease being taken ahead (Config.LeaseAhead) is waited for and
// returned too; when ctx ends first, its take is cancelled, and ReturnLeases
// returns once it has stopped: no goroutine of a lease outlives it, unless
// calls running meanwhile start one. A lease taken afterwards works as
// before. It returns the first error and leaves the slices of that lease
// not yet returned as they were.
func (l *Limiter[TTx]) ReturnLeases(ctx context.Context) error {
	for k, le := range l.leases.all() {
		le.mu.Lock()
		err := le.awaitAhead(ctx, true)
		if err == nil {
			err = l.endSlice(ctx, k.Name, k.Key, &le.cur)
		}
		if err == nil {
			err = l.endSlice(ctx, k.Name, k.Key, &le.next)
		}
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
	case c.Kind != TokenBucket && c.Kind != FixedWindow:
		return "applies to TokenBucket and FixedWindow limits, whose tokens a lease can hold, not to a " + c.Kind.name()
	}
	return ""
}

// leaseAheadProblem is what is wrong with c's LeaseAhead, or "". It may
// equal Lease, not exceed it: a slice holds at most Lease tokens once it
// has handed one out, so LeaseAhead = Lease already takes the next slice
// at a slice's first call, and more would promise what it cannot do.
func (c Config) leaseAheadProblem() string {
	switch {
	case c.LeaseAhead == 0:
		return ""
	case !finite(c.LeaseAhead) || c.LeaseAhead < 0:
		return "must be a finite number of tokens >= 0 (0: the next lease is taken when the lease runs out)"
	case c.Lease == 0:
		return "needs Lease: it is how low a lease runs before the next one is taken; set Lease too, or leave LeaseAhead 0"
	case c.LeaseAhead > c.Lease:
		return fmt.Sprintf("exceeds Lease (%v): LeaseAhead = Lease already takes the next lease at a lease's first call; set at most Lease, such as Lease/2", c.Lease)
	}
	return ""
}
