// Package retrytx is the retry loop the stores' RunTx share, around each
// store's own BEGIN, COMMIT and Retryable.
package retrytx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txlimit/txlimit/jitter"
)

// Ambiguous marks an error from COMMIT after which the transaction's fate is
// unknown: Run returns it at once, unwrapped.
type Ambiguous struct{ Err error }

func (e *Ambiguous) Error() string { return e.Err.Error() }
func (e *Ambiguous) Unwrap() error { return e.Err }

// Run calls run until it returns nil, an error retryable does not accept,
// an *Ambiguous, or attempts errors, waiting between attempts a backoff that
// doubles from 10ms, each drawn uniformly from its upper half. It stops at
// once when ctx ends and does not start a wait that would outlast ctx's
// deadline. who names the caller in the error of the last attempt.
func Run(ctx context.Context, who string, attempts int, retryable func(error) bool, run func() error) error {
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := run()
		var ambiguous *Ambiguous
		switch {
		case errors.As(err, &ambiguous):
			return ambiguous.Err
		case err == nil || !retryable(err):
			return err
		case attempt >= attempts:
			return fmt.Errorf("%s: gave up after %d attempts: %w", who, attempt, err)
		}
		wait := jitter.Spread(backoff/2, backoff/2)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
		backoff *= 2
	}
}
