package txlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// Pause is PauseTx in a short transaction of its own.
func (l *Limiter[TTx]) Pause(ctx context.Context, name, key string, until time.Time, opts ...Option) error {
	return l.pauseIn(ctx, nil, name, key, until, opts)
}

// PauseTx pauses (name, key) until the instant until, in tx: from the
// moment tx commits, every call on the key (LimitTx, LimitAll, CheckTx,
// Wait, a reservation, UpTo, from any process and any Limiter on the same
// database) is denied, taking nothing, with RetryAfter the time left until
// until and Result.Paused set, whatever the tokens, until the clock reaches
// until; then the limit decides as before, its tokens as they were. A
// rolled-back tx leaves no pause. Pausing again replaces the instant, later
// or earlier; a zero until, or one not after the clock, lifts the pause.
// The pause lives on the key's rows (created full for a key without any),
// so Prune keeps it until it ends, and Reset deletes it with them.
//
// Pause records what an upstream service or an operator said: an answer of
// 429 with Retry-After (httplimit.RetryAfter reads it), a key blocked until
// tomorrow. Only Inline is used among opts. A Concurrency limit cannot be
// paused: it is an *InvalidError.
func (l *Limiter[TTx]) PauseTx(ctx context.Context, tx TTx, name, key string, until time.Time, opts ...Option) error {
	return l.pauseIn(ctx, &tx, name, key, until, opts)
}

func (l *Limiter[TTx]) pauseIn(ctx context.Context, tx *TTx, name, key string, until time.Time, opts []Option) error {
	r, err := l.newRequest(name, key, opts, l.observe())
	if err == nil && r.slot() {
		err = &InvalidError{Limit: name, Field: "name", Problem: "is a Concurrency limit, which Pause does not support: " +
			"pause the rate limit taken with it (LimitAll), or stop acquiring in the application"}
	}
	if err == nil && !until.IsZero() {
		err = l.checkPause(name, until)
	}
	if err == nil {
		_, err = in(ctx, l, tx, false, func(tx TTx) (struct{}, error) {
			p := driver.PauseParams{Limit: r.limit, Now: r.now}
			if !until.IsZero() {
				p.Until = time.UnixMicro(until.UnixMicro())
			}
			return struct{}{}, l.store.Pause(ctx, tx, p)
		})
	}
	l.report(ctx, r.obs, opPause, r, Result{}, err, false)
	return err
}

// checkPause refuses an instant the store's database cannot hold.
func (l *Limiter[TTx]) checkPause(name string, until time.Time) error {
	first, last := driver.Microseconds[0], driver.Microseconds[1]
	if r, ok := l.store.(driver.ClockRanger); ok {
		first, last = r.ClockRange()
	}
	if until.Before(first) || until.After(last) {
		return &InvalidError{Limit: name, Field: "until", Problem: fmt.Sprintf(
			"is %v, outside the instants the store's database can hold (%v to %v); pause until an earlier instant, or pass the zero time.Time to lift the pause",
			until, first.Format(time.RFC3339), last.Format(time.RFC3339))}
	}
	return nil
}
