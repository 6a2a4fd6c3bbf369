// Package waitsleep is the sleep Limiter.Wait takes between its attempts,
// and the one way to replace it: a context may carry a sleep of its own
// (With), which Wait then uses instead of a timer. The conformance suite
// (internal/testkit/storetest) does, to run Wait on a virtual clock against
// every store, where the outcome depends on the jitter drawn and never on
// the machine's speed. The package is internal, so an application's context
// never carries one.
package waitsleep

import (
	"context"
	"time"
)

// Func sleeps for d, or until ctx ends, whichever comes first, and then
// returns nil, or ctx's error.
type Func func(ctx context.Context, d time.Duration) error

type key struct{}

// With returns ctx carrying sleep, for Wait to use.
func With(ctx context.Context, sleep Func) context.Context {
	return context.WithValue(ctx, key{}, sleep)
}

// From returns the sleep ctx carries, or one on a timer of the process's
// clock.
func From(ctx context.Context) Func {
	if f, ok := ctx.Value(key{}).(Func); ok {
		return f
	}
	return func(ctx context.Context, d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
