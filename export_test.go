package txlimit

import (
	"context"
	"time"
)

// WaitWithSleep is Wait sleeping with sleep instead of a timer, for tests
// that run Wait on a virtual clock.
func WaitWithSleep[TTx any](ctx context.Context, l *Limiter[TTx], sleep func(context.Context, time.Duration) error, name, key string, opts ...Option) (Result, error) {
	return l.wait(ctx, sleep, name, key, opts)
}

// EventOutcome and EventErrorKind are what the Limiter fills an Event's
// Outcome and ErrorKind with.
func EventOutcome(e Event) string   { return e.outcome() }
func EventErrorKind(e Event) string { return e.errorKind() }
