package promobserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/promobserver"
)

// BenchmarkObserve measures what the Observer adds to one call:
// go test -run '^$' -bench Observe .
func BenchmarkObserve(b *testing.B) {
	obs, err := promobserver.New(prometheus.NewRegistry(), nil)
	if err != nil {
		b.Fatal(err)
	}
	e := txlimit.Event{Op: "limit", Name: "sendMessage", Key: "alice", Count: 1,
		Result: txlimit.Result{OK: true}, Duration: 2 * time.Millisecond, LockWait: time.Millisecond}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		obs.Observe(ctx, e)
	}
}
