package otelobserver_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/otelobserver"
)

// BenchmarkObserve measures what the Observer adds to one call, with the
// SDK recording into a ManualReader: go test -run '^$' -bench Observe .
func BenchmarkObserve(b *testing.B) {
	obs, err := otelobserver.New(otelobserver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
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
