package storetest

import (
	"context"
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
	snap, err := l.Value(context.Background(), name, "k")
	require.NoError(t, err)
	require.Zero(t, snap.Value)
}
