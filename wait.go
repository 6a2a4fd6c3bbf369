package txlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/txlimit/txlimit/internal/waitsleep"
	"github.com/txlimit/txlimit/jitter"
)

// Wait blocks until the limit name grants key its tokens, then returns the
// granted Result: Limit in a loop, for workers that would rather wait than
// be told no. Count(n) makes it what x/time/rate calls WaitN.
//
// Each attempt is a Limit call. After a denial Wait sleeps, holding no
// transaction and no connection, for the denial's RetryAfter plus a random
// extra drawn uniformly from [0, spread) (jitter.Spread), spread being the
// time the limit takes to add the count (count × Period/Rate), at most
// Period: a token that arrives while callers wait is granted within spread.
//
// If ctx has a deadline and the denial's RetryAfter would end after it, Wait
// returns at once with the denied Result and an error that matches both
// context.DeadlineExceeded and ErrRateLimited (errors.Is) and is a
// *RateLimitedError for errors.As. The random extra is never drawn past the
// deadline. If ctx ends while Wait sleeps, it returns the last denied Result
// and ctx.Err(). A wait beyond about 146 years says so: with a deadline
// Wait returns at once, without one it sleeps until ctx ends. RetryAfter is
// on the limiter's clock and Wait sleeps on the process's: with an
// Options.Clock that does not move, Wait waits until ctx ends.
//
// Bad input, a count above Capacity included, is the *InvalidError Limit
// returns, at once; errors of the store are returned as Limit returns them
// (with Options.FailOpen, a failing store grants the call). Wait refuses
// Reserve: a reservation is granted at once; call Limit with Reserve and
// sleep the Result's RetryAfter.
//
// With Idempotent, the denials record nothing and the grant is recorded: a
// Wait run again for the same request (a job retried) returns the first
// grant at once, taking nothing.
//
// The tokens are spent whatever the caller does next. There is no WaitTx
// (it would hold the caller's locks while it sleeps): to spend the tokens
// only if the work commits, wait with Check's RetryAfter outside the
// transaction and take them with LimitTx inside it.
func (l *Limiter[TTx]) Wait(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	// A timer, unless the conformance suite runs Wait on a virtual clock.
	sleep := waitsleep.From(ctx)
	o := callOptions{count: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.reserve {
		return Result{}, &InvalidError{Limit: name, Field: "Reserve", Problem: "does not go with Wait: a reservation is granted at once; " +
			"call Limit with Reserve and run the work after the Result's RetryAfter"}
	}
	if c, ok := l.limits[name]; (o.config == nil && ok && c.Kind == Concurrency) || (o.config != nil && o.config.Kind == Concurrency) {
		return Result{}, &InvalidError{Limit: name, Field: "name", Problem: "is a Concurrency limit, which Wait does not take: " +
			"a slot comes back when its holder releases it, which no clock predicts (RetryAfter is only the latest it " +
			"comes back); call Limit again at a pace of your own"}
	}
	for {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		res, err := l.Limit(ctx, name, key, opts...)
		if err != nil || res.OK {
			return res, err
		}
		// A denial: the call was valid, so the limit has a config.
		cfg := l.limits[name]
		if o.config != nil {
			cfg = *o.config
		}
		spread := time.Duration(min(o.count*float64(cfg.Period)/cfg.Rate, float64(cfg.Period)))
		if deadline, ok := ctx.Deadline(); ok {
			left := time.Until(deadline)
			if res.RetryAfter >= left {
				return res, &waitDeadlineError{res: res, left: left}
			}
			spread = min(spread, left-res.RetryAfter)
		}
		if err := sleep(ctx, jitter.Spread(res.RetryAfter, spread)); err != nil {
			return res, err
		}
	}
}

// waitDeadlineError is Wait's error when the wait would end after ctx's
// deadline.
type waitDeadlineError struct {
	res  Result
	left time.Duration
}

func (e *waitDeadlineError) Error() string {
	return fmt.Sprintf("txlimit: Wait for limit %q key %q: the tokens come in %v, after the context's deadline (%v away)",
		e.res.Name, e.res.Key, e.res.RetryAfter, e.left.Round(time.Millisecond))
}

// Unwrap makes the error match context.DeadlineExceeded and the
// *RateLimitedError of the denial.
func (e *waitDeadlineError) Unwrap() []error {
	return []error{context.DeadlineExceeded, e.res.Err()}
}
