package txlimit

import (
	"context"
	"sync"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// defaultLeaseFor is how long a lease lasts when Config.LeaseFor is 0.
const defaultLeaseFor = time.Second

// lease is the tokens of one (name, key) this Limiter took from the limit
// and hands out to Commit: the slice it hands out from (cur) and, with
// Config.LeaseAhead, one taken ahead (next) to replace it. Each slice keeps
// its own times, so that a token is spent or given back within its take's.
type lease struct {
	mu        sync.Mutex
	cur, next slice
	// ahead is the take of next in flight, or nil; next is empty while it
	// runs.
	ahead *takeAhead
	gens  uint64 // slices taken, for their gen
}

// slice is the tokens of one take of a lease; the zero slice is none.
type slice struct {
	tokens float64
	// until is when the slice ends, on this process's clock: LeaseFor
	// after it was taken, or at the end of its FixedWindow if sooner.
	until time.Time
	// returnBy is until for a TokenBucket, the end of the window for a
	// FixedWindow: the time its unspent tokens may go back (returnTokens).
	returnBy time.Time
	config   Config // the tokens were taken under
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

// settle waits until no lease of k is being taken, so that a read of the
// limit's row and of the lease's tokens agree (Check).
func (l *Limiter[TTx]) settle(ctx context.Context, k driver.KeyRef) error {
	v, ok := l.leases.Load(k)
	if !ok {
		return nil
	}
	le := v.(*lease)
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

// fromLease hands r's tokens out of its key's lease. A slice that is over
// or lacks them is ended, and the one taken ahead replaces it (waited for
// while in flight), or else takeLease takes one, or res is its denial.
// With LeaseAhead, a slice left with fewer tokens has the next one taken.
func (l *Limiter[TTx]) fromLease(ctx context.Context, r request) (res Result, got leased, err error) {
	k := driver.KeyRef{Name: r.name, Key: r.key}
	v, ok := l.leases.Load(k)
	if !ok {
		v, _ = l.leases.LoadOrStore(k, &lease{})
	}
	le := v.(*lease)
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

// takeLease takes a new slice of up to max(Lease, r.count) tokens into
// le.cur, which is empty. Fewer than r.count is a denial, with the wait
// Check gives, and what was taken goes back at once.
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
		// Tokens credited since the take may make Check grant: the call
		// is still denied, with RetryAfter 0.
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
// its own, as a slice lasting LeaseFor from before the take (a
// FixedWindow's, no longer than its window). The caller sets its gen.
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
		// The tokens are this window's: its end, measured on this clock
		// from before the take, is never later than the window's.
		period := r.config.Period.Microseconds()
		end := time.UnixMicro(algo.WindowStart(r.limit.Origin, period, t.At.UnixMicro()) + period)
		s.returnBy = before.Add(end.Sub(t.At))
		if s.returnBy.Before(s.until) {
			s.until = s.returnBy
		}
	}
	return s, nil
}

// startTakeAhead takes le's next slice of up to Lease tokens in the
// background, le.mu held, in a context the caller's ending does not cancel
// (other callers hand its tokens out), bounded by LeaseFor. A take that
// fails only goes to the Observer (Op "lease_ahead").
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

// awaitAhead waits, le.mu held (and unlocked meanwhile), until le has no
// take ahead in flight, or returns ctx's error, having cancelled the take
// and waited for it to end when cancel is set.
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

// leaseNow is the clock leases last on: this process's, or Options.Clock.
func (l *Limiter[TTx]) leaseNow() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now()
}

// endSlice gives s's tokens back to the limit (returnTokens) and empties
// it, so that those handed out from it go back to the limit too.
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

// returnTokens credits n unspent tokens of a lease back to the limit before
// returnBy and drops them after: a later credit would add tokens that the
// bucket's Capacity, or the window's end, would have cut meanwhile, and the
// limit could admit more than it would without leases.
func (l *Limiter[TTx]) returnTokens(ctx context.Context, name, key string, c Config, n float64, returnBy time.Time) error {
	if n <= 0 || !l.leaseNow().Before(returnBy) {
		return nil
	}
	return l.creditIn(ctx, nil, name, key, n, []Option{Inline(c)})
}

// leased is the tokens of (name, key) that this Limiter holds in leases and
// has not handed out.
func (l *Limiter[TTx]) leased(name, key string) float64 {
	v, ok := l.leases.Load(driver.KeyRef{Name: name, Key: key})
	if !ok {
		return 0
	}
	le := v.(*lease)
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.cur.tokens + le.next.tokens
}

// ReturnLeases ends every lease the Limiter holds (Config.Lease), giving
// their unspent tokens back to their limits, each in a short transaction of
// its own (those of a lease past its time are dropped): call it when the
// process stops, so that the tokens are not lost with it. A lease being
// taken ahead is waited for and returned too; when ctx ends first, its take
// is cancelled and stopped before ReturnLeases returns, so that no
// goroutine of a lease outlives it (unless calls running meanwhile start
// one). Leases taken afterwards work as before. It returns the first error,
// leaving that lease's slices not yet returned as they were.
func (l *Limiter[TTx]) ReturnLeases(ctx context.Context) (err error) {
	l.leases.Range(func(k, v any) bool {
		key, le := k.(driver.KeyRef), v.(*lease)
		le.mu.Lock()
		defer le.mu.Unlock()
		err = le.awaitAhead(ctx, true)
		if err == nil {
			err = l.endSlice(ctx, key.Name, key.Key, &le.cur)
		}
		if err == nil {
			err = l.endSlice(ctx, key.Name, key.Key, &le.next)
		}
		return err == nil
	})
	return err
}
