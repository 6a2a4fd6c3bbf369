package storetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
)

// RequireExactAdmission runs clients goroutines, each making calls calls of
// call, and requires that no call errs, that exactly capacity of them are
// granted, and that limit name of l holds nothing afterwards (key "k").
func RequireExactAdmission[TTx any](t *testing.T, l *txlimit.Limiter[TTx], name string, clients, calls, capacity int, call func() (txlimit.Result, error)) {
	t.Helper()
	var granted, denied atomic.Int64
	errs := make(chan error, clients*calls)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range calls {
				res, err := call()
				switch {
				case err != nil:
					errs <- err
				case res.OK:
					granted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, capacity, granted.Load())
	require.EqualValues(t, clients*calls-capacity, denied.Load())
	res, err := l.Check(context.Background(), name, "k", txlimit.Count(0))
	require.NoError(t, err)
	require.Zero(t, res.Remaining)
}

// RequireUnknownLimit requires err to be the *InvalidError of a call on a
// name that New was not given, without Inline.
func RequireUnknownLimit(t testing.TB, err error) {
	t.Helper()
	var inv *txlimit.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "name", inv.Field)
	require.Contains(t, inv.Problem, "is not a limit given to txlimit.New")
}

// ObserverFunc is a function of the type of txlimit.Options.Observer,
// named so that a test can write one inline and pass it on; its Observe
// method makes it a value like the Observers of otelobserver and
// promobserver, whose Observe is what Options.Observer takes.
type ObserverFunc func(ctx context.Context, e txlimit.Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e txlimit.Event) { f(ctx, e) }

// Denied returns the results of the limits of m that denied, in request
// order.
func Denied(m txlimit.MultiResult) []txlimit.Result {
	var out []txlimit.Result
	for _, r := range m.Results {
		if !r.OK {
			out = append(out, r)
		}
	}
	return out
}

// Reserved reports whether r granted its tokens as a reservation for later:
// OK, with the work to run after RetryAfter.
func Reserved(r txlimit.Result) bool { return r.OK && r.RetryAfter > 0 }

// noPool reports whether err is the *InvalidError of a form without Tx on
// a store built without a pool, which that form needs.
func noPool(err error) bool {
	var inv *txlimit.InvalidError
	return errors.As(err, &inv) && inv.Field == "store"
}

// RequireNoPool requires err to be the error of a form without Tx on a
// store built without a pool: an *InvalidError for the field "store" that
// names the fix.
func RequireNoPool(t testing.TB, err error) {
	t.Helper()
	var inv *txlimit.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "store", inv.Field)
	require.Contains(t, inv.Problem, "…Tx form")
}
