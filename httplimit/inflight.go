package httplimit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/txlimit/txlimit"
)

// releaseTimeout bounds each release and each extension of a request's
// slots. They run without the request's cancellation (a client that goes
// away must not leave its slot taken), so they need a bound of their own: a
// release that has not finished by then leaves the slot to its expiry.
const releaseTimeout = 10 * time.Second

// errTxSlots is Tx's error for a Limit with a Concurrency limit.
var errTxSlots = errors.New("httplimit: Tx cannot apply a Concurrency limit: it returns before the handler ends, " +
	"and nothing would give the request's slot back; use Handler, which releases it when the handler returns")

// checkSlot checks a Rule of a Concurrency limit.
func checkSlot(r Rule) error {
	switch {
	case r.Count != nil:
		return fmt.Errorf("httplimit: limit %q is a Concurrency limit, of which a request holds one slot; leave Count unset", r.Name)
	case r.Charge != nil || r.Mode != Refund:
		return fmt.Errorf("httplimit: limit %q is a Concurrency limit, whose slot comes back when the handler returns "+
			"whatever it answered; leave Charge and Mode unset", r.Name)
	}
	return nil
}

// newHolder returns the holder id of a request's slots: random, so that no
// two requests share one.
func newHolder() string { return rand.Text() }

// acquireFailed gives back, as far as it can, the slots of reqs that an
// acquire which failed with err may have taken all the same: a commit cut
// off by a dropped connection may have committed. A bad request wrote
// nothing.
func (m *Limit[TTx]) acquireFailed(r *http.Request, reqs []txlimit.Request, holder string, err error) {
	if holder == "" || reqs == nil {
		return
	}
	if _, invalid := errors.AsType[*txlimit.InvalidError](err); invalid {
		return
	}
	m.release(r, m.slotRequests(reqs, nil), holder)
}

// slotRequests returns the requests of reqs that acquire a slot; with res,
// only those that res holds (a grant that txlimit.Options.FailOpen made
// holds nothing).
func (m *Limit[TTx]) slotRequests(reqs []txlimit.Request, res *txlimit.MultiResult) []txlimit.Request {
	var out []txlimit.Request
	for i, ru := range m.rules {
		if ru.slot && (res == nil || !res.Results[i].FailedOpen) {
			out = append(out, reqs[i])
		}
	}
	return out
}

// hold keeps the slots that the granted res holds while the handler of r
// runs. It returns the request to hand the handler and the function to
// call when the handler has returned (or panicked), which releases them.
//
// A handler that runs for longer than a third of the shortest HoldFor of
// the slots gets its slots extended every HoldFor/3, so that a long request
// does not lose its slot to its expiry. When an extension finds a slot lost
// (released or reclaimed by hand), or cannot reach the database until the
// slot would have expired, the request's context is cancelled: another
// request may hold the slot by then.
func (m *Limit[TTx]) hold(r *http.Request, reqs []txlimit.Request, holder string, res txlimit.MultiResult) (*http.Request, func()) {
	held := m.slotRequests(reqs, &res)
	if len(held) == 0 {
		return r, func() {}
	}
	every := m.holdFor / 3
	ctx, cancel := context.WithCancelCause(r.Context())
	// mu is held by an extension while it runs, so that the release waits
	// for it rather than racing it (an extension after the release would
	// find the slot gone).
	var mu sync.Mutex
	done := false
	lastOK := time.Now()
	var timer *time.Timer
	mu.Lock() // until timer is set: the function reads it
	defer mu.Unlock()
	timer = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		for _, q := range held {
			ok, err := m.extend(r, q, holder)
			switch {
			case err == nil && !ok:
				cancel(fmt.Errorf("httplimit: the request's slot of Concurrency limit %q was lost (released or reclaimed) while the handler ran; another request may hold it now", q.Name))
				m.logSlot(r, q.Name, holder, "the request's slot was lost while its handler ran; its context is cancelled", nil)
				return
			case err != nil && time.Since(lastOK)+every >= m.holdFor:
				cancel(fmt.Errorf("httplimit: the request's slot of Concurrency limit %q could not be extended, and has expired by now: %w", q.Name, err))
				m.logSlot(r, q.Name, holder, "could not extend the request's slot before its expiry; its context is cancelled", err)
				return
			case err != nil:
				m.logSlot(r, q.Name, holder, "could not extend the request's slot; trying again", err)
				timer.Reset(every)
				return
			}
		}
		lastOK = time.Now()
		timer.Reset(every)
	})
	return r.WithContext(ctx), func() {
		mu.Lock()
		done = true
		timer.Stop()
		mu.Unlock()
		m.release(r, held, holder)
		cancel(nil)
	}
}

// extend pushes the expiry of holder's slot of q, bounded by
// releaseTimeout.
func (m *Limit[TTx]) extend(r *http.Request, q txlimit.Request, holder string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	return m.limiter.Extend(ctx, q.Name, q.Key, holder)
}

// release gives back holder's slots of held, in a context that the
// request's cancellation does not reach, bounded by releaseTimeout. An
// error is logged: the slot comes back at its expiry.
func (m *Limit[TTx]) release(r *http.Request, held []txlimit.Request, holder string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	for _, q := range held {
		if _, err := m.limiter.Release(ctx, q.Name, q.Key, holder); err != nil {
			m.logSlot(r, q.Name, holder, "could not release the request's slot; it comes back at its expiry (HoldFor)", err)
		}
	}
}

// logSlot logs a failure to keep or give back a request's slot to
// Options.Logger.
func (m *Limit[TTx]) logSlot(r *http.Request, limit, holder, what string, err error) {
	attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("limit", limit), slog.String("holder", holder)}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	m.log(r.Context(), "httplimit: "+what, attrs...)
}
