package otelobserver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/observertest"
	"github.com/txlimit/txlimit/otelobserver"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

func newObserver(t *testing.T, opts ...otelobserver.Option) (*otelobserver.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelobserver.New(append(opts, otelobserver.WithMeterProvider(mp))...)
	require.NoError(t, err)
	return obs, reader
}

func TestMetricsSQLite(t *testing.T) {
	t.Parallel()
	obs, reader := newObserver(t)
	observertest.RunScenario(t, sqlitestore.New(observertest.SQLite(t, true)), sqlitestore.New(observertest.SQLite(t, false)), sqlitestore.New(observertest.ClosedSQLite(t)), obs)
	checkMetrics(t, reader)
}

func TestMetricsPostgres(t *testing.T) {
	t.Parallel()
	obs, reader := newObserver(t)
	observertest.RunScenario(t, pgstore.New(observertest.Postgres(t, true)), pgstore.New(observertest.Postgres(t, false)), pgstore.New(observertest.ClosedPostgres(t)), obs)
	checkMetrics(t, reader)
}

// checkMetrics reads the metrics after runScenario and checks every count.
func checkMetrics(t *testing.T, reader *sdkmetric.ManualReader) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	require.Equal(t, otelobserver.ScopeName, rm.ScopeMetrics[0].Scope.Name)
	metrics := map[string]metricdata.Metrics{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		metrics[m.Name] = m
	}

	decisions := sums(t, metrics["txlimit.decisions"], otelobserver.AttrOutcome)
	require.Equal(t, observertest.WantDecisions, decisions)
	require.Equal(t, "{call}", metrics["txlimit.decisions"].Unit)
	require.Equal(t, observertest.WantErrors, sums(t, metrics["txlimit.errors"], otelobserver.AttrErrorType))

	// One duration per decision, by the same attributes; one lock wait per
	// decision, by limit and op.
	durations := histogramCounts(t, metrics["txlimit.call.duration"], otelobserver.AttrOutcome)
	require.Equal(t, observertest.WantDecisions, durations)
	wantLockWaits := map[string]int64{}
	for k, n := range observertest.WantDecisions {
		f := strings.Fields(k)
		wantLockWaits[f[0]+" "+f[1]] += n
	}
	require.Equal(t, wantLockWaits, histogramCounts(t, metrics["txlimit.lock_wait.duration"], ""))
	for _, name := range []string{"txlimit.call.duration", "txlimit.lock_wait.duration"} {
		require.Equal(t, "s", metrics[name].Unit)
		for _, dp := range metrics[name].Data.(metricdata.Histogram[float64]).DataPoints {
			require.Equal(t, otelobserver.DurationBuckets, dp.Bounds)
			require.GreaterOrEqual(t, dp.Sum, 0.0)
		}
	}
	// An allowed call on a real database takes time; a denied Check with a
	// frozen clock locks nothing.
	for _, dp := range metrics["txlimit.call.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
		require.Greater(t, dp.Sum, 0.0, "%v", dp.Attributes)
	}
}

// label renders a data point's attributes as "limit op <last>", where last
// is the value of the attribute last (none when empty), and checks that no
// other attribute is there: no key, in particular.
func label(t *testing.T, attrs attribute.Set, last attribute.Key) string {
	t.Helper()
	want := 2
	parts := []string{}
	for _, k := range []attribute.Key{otelobserver.AttrLimit, otelobserver.AttrOp, last} {
		if k == "" {
			continue
		}
		v, ok := attrs.Value(k)
		require.True(t, ok, "%s missing from %v", k, attrs)
		parts = append(parts, v.AsString())
	}
	if last != "" {
		want = 3
	}
	require.Equal(t, want, attrs.Len(), "attributes %v", attrs.ToSlice())
	return strings.Join(parts, " ")
}

func sums(t *testing.T, m metricdata.Metrics, last attribute.Key) map[string]int64 {
	t.Helper()
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is %T", m.Name, m.Data)
	require.True(t, sum.IsMonotonic)
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		out[label(t, dp.Attributes, last)] += dp.Value
	}
	return out
}

func histogramCounts(t *testing.T, m metricdata.Metrics, last attribute.Key) map[string]int64 {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is %T", m.Name, m.Data)
	out := map[string]int64{}
	for _, dp := range h.DataPoints {
		out[label(t, dp.Attributes, last)] += int64(dp.Count)
	}
	return out
}

// tee records the Events it passes on.
type tee struct {
	next   func(context.Context, txlimit.Event)
	mu     sync.Mutex
	events []txlimit.Event
}

func (o *tee) Observe(ctx context.Context, e txlimit.Event) {
	o.next(ctx, e)
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func TestSpansPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := observertest.Postgres(t, true)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, reader := newObserver(t, otelobserver.WithTracerProvider(tp), otelobserver.WithKeys())
	rec := &tee{next: obs.Observe}
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"send": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
	}, &txlimit.Options{Observer: rec.Observe})
	require.NoError(t, err)

	ctx, parent := tp.Tracer("test").Start(ctx, "handler")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := l.LimitTx(ctx, tx, "send", "alice")
		require.NoError(t, err)
		require.True(t, res.OK)
		res, err = l.LimitTx(ctx, tx, "send", "alice")
		require.NoError(t, err)
		require.False(t, res.OK)
		_, err = l.LimitTx(ctx, tx, "send", "bad\x00key")
		require.ErrorAs(t, err, new(*txlimit.InvalidError))
		return nil
	})
	require.NoError(t, err)
	parent.End()

	ended := spans.Ended()
	require.Len(t, ended, 4) // three calls and the parent
	require.Len(t, rec.events, 3)
	for i, e := range rec.events {
		s := ended[i]
		require.Equal(t, "txlimit.limit", s.Name())
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
		require.Equal(t, e.Duration, s.EndTime().Sub(s.StartTime()), "a span lasts exactly the call's duration")
		require.False(t, s.StartTime().Before(ended[3].StartTime()))
		attrs := attribute.NewSet(s.Attributes()...)
		key, _ := attrs.Value(otelobserver.AttrKey)
		require.Equal(t, e.Key, key.AsString())
		outcome, _ := attrs.Value(otelobserver.AttrOutcome)
		require.Equal(t, e.Outcome, outcome.AsString())
	}
	require.Equal(t, codes.Unset, ended[0].Status().Code)
	require.Equal(t, codes.Unset, ended[1].Status().Code, "a denial is not an error")
	require.Equal(t, codes.Error, ended[2].Status().Code)
	require.Len(t, ended[2].Events(), 1)
	require.Equal(t, "exception", ended[2].Events()[0].Name)

	// WithKeys: the key is a metric attribute too.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	keys := map[string]int64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "txlimit.decisions" {
			continue
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			k, _ := dp.Attributes.Value(otelobserver.AttrKey)
			o, _ := dp.Attributes.Value(otelobserver.AttrOutcome)
			keys[fmt.Sprintf("%q %s", k.AsString(), o.AsString())] += dp.Value
		}
	}
	require.Equal(t, map[string]int64{`"alice" allowed`: 1, `"alice" denied`: 1, `"bad\x00key" error`: 1}, keys)
}
