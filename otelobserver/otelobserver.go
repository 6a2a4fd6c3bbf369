// Package otelobserver exports what a txlimit.Limiter decides as
// OpenTelemetry metrics and, optionally, spans. It is a module of its own
// (github.com/txlimit/txlimit/otelobserver), so that OpenTelemetry stays out
// of the dependency graph of applications that do not use it.
//
//	obs, err := otelobserver.New() // the global MeterProvider; see the options
//	if err != nil { … }
//	limiter, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Observer: obs.Observe})
//
// # Metrics
//
// Every Event of the Limiter (every call of Limit, Check, LimitAll, Commit
// and the others, with their Tx forms; Event.Op names it) records:
//
//   - txlimit.decisions (counter, {call}): one per Event, by txlimit.limit,
//     txlimit.op and txlimit.outcome. The outcome is Event.Outcome:
//     allowed, reserved, denied, failed_open or error. A LimitAll call counts
//     once per limit it names (once in all when it failed before deciding).
//   - txlimit.call.duration (histogram, s): Event.Duration, how long the
//     caller waited, by limit, op and outcome.
//   - txlimit.lock_wait.duration (histogram, s): Event.LockWait, the part of
//     the call spent in the statements that lock the limit's rows, by limit
//     and op. A lock wait close to the call's duration on a busy limit is
//     the sign that it needs Shards.
//   - txlimit.errors (counter, {error}): one per Event with an error,
//     including those Options.FailOpen turned into grants, by limit, op and
//     error.type, which is txlimit.Event.ErrorKind: invalid (bad input, an
//     unknown limit, a store without a pool), not_migrated, canceled,
//     deadline_exceeded or database.
//
// Both histograms use the boundaries in DurationBuckets (0.5 ms to 10 s),
// given to the SDK as advice: a View in the application's MeterProvider
// overrides them. The SDK's own default boundaries (0 to 10000) are meant for
// milliseconds and would put every call in the first two buckets.
//
// Keys are not attributes by default: a limit per user or per IP address has
// as many keys as there are users or addresses, and every distinct attribute
// set is a time series that the SDK keeps in memory for the life of the
// process and the backend stores and bills. WithKeys adds txlimit.key to
// every metric and span; use it only for limits with a handful of keys.
//
// # Spans
//
// With WithTracerProvider, every Event also becomes a span named
// "txlimit.<op>" (txlimit.limit, txlimit.check, txlimit.limit_all), child of
// the span in the call's context. A Limiter calls its Observer once the call
// has decided, so the span is made after the fact: it starts Event.Duration
// before the Observer is called and ends when it is called. Its timing is
// right, but spans that other instrumentation made during the call (a pgx
// tracer's query spans, for example) are its siblings, not its children,
// and a sampler sees it only when it is already over. A call that returned
// an error has status Error and the error recorded; a call that failed open
// has the error recorded and status Unset, since the caller got its grant.
// A denial is not an error.
package otelobserver

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txlimit/txlimit"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/txlimit/txlimit/otelobserver"

// DurationBuckets are the histogram boundaries, in seconds, of
// txlimit.call.duration and txlimit.lock_wait.duration: from a fast call on a
// local database to a call that waited seconds for a hot row.
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Attribute keys.
const (
	AttrLimit     = attribute.Key("txlimit.limit")
	AttrKey       = attribute.Key("txlimit.key")
	AttrOp        = attribute.Key("txlimit.op")
	AttrOutcome   = attribute.Key("txlimit.outcome")
	AttrErrorType = attribute.Key("error.type")
)

// Option configures New.
type Option func(*config)

type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	keys           bool
}

// WithMeterProvider sets the MeterProvider the metrics are recorded with.
// Defaults to otel.GetMeterProvider(), the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithTracerProvider turns on spans, one per Event, made with tp (see the
// package documentation for what a span made after the fact means).
// Defaults to no spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithKeys adds the limit's key (txlimit.key) to every metric's attributes
// and every span. Each distinct key is then a time series of its own: only
// for limits with few keys. Defaults to off.
func WithKeys() Option {
	return func(c *config) { c.keys = true }
}

// Observer records metrics and, optionally, spans of the Events its Observe
// method is given: pass obs.Observe as txlimit.Options.Observer. It is safe
// for concurrent use.
type Observer struct {
	keys      bool
	tracer    trace.Tracer // nil: no spans
	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	lockWait  metric.Float64Histogram
	errors    metric.Int64Counter
	cache     sync.Map // attrKey → *attrSets, without keys
}

// New returns an Observer whose instruments are created on the configured
// MeterProvider. Pass its Observe method as txlimit.Options.Observer.
func New(opts ...Option) (*Observer, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	meter := c.meterProvider.Meter(ScopeName)
	o := &Observer{keys: c.keys}
	if c.tracerProvider != nil {
		o.tracer = c.tracerProvider.Tracer(ScopeName)
	}
	var err error
	if o.decisions, err = meter.Int64Counter("txlimit.decisions",
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls of a txlimit Limiter by limit, operation and outcome (allowed, reserved, denied, failed_open, error).")); err != nil {
		return nil, err
	}
	if o.duration, err = meter.Float64Histogram("txlimit.call.duration",
		metric.WithUnit("s"),
		metric.WithDescription("How long a txlimit call took, as its caller waited for it."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	if o.lockWait, err = meter.Float64Histogram("txlimit.lock_wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("The part of a txlimit call spent in the statements that lock the limit's rows, waiting for other transactions included."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	if o.errors, err = meter.Int64Counter("txlimit.errors",
		metric.WithUnit("{error}"),
		metric.WithDescription("Errors of txlimit calls, failed-open ones included, by kind (error.type).")); err != nil {
		return nil, err
	}
	return o, nil
}

// Observe records e. Its signature is txlimit.Options.Observer's.
func (o *Observer) Observe(ctx context.Context, e txlimit.Event) {
	end := time.Now()
	outcome := e.Outcome
	a := o.attrs(e, outcome)
	o.decisions.Add(ctx, 1, a.byOutcome)
	o.duration.Record(ctx, e.Duration.Seconds(), a.byOutcome)
	o.lockWait.Record(ctx, e.LockWait.Seconds(), a.base)
	if e.Err != nil {
		o.errors.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(a.list[:len(a.list)-1:len(a.list)-1], AttrErrorType.String(e.ErrorKind))...)))
	}
	if o.tracer != nil {
		o.span(ctx, e, a.list, end)
	}
}

// attrSets are the attributes of one (limit, op, outcome[, key]).
type attrSets struct {
	list      []attribute.KeyValue // limit, op[, key], outcome
	base      metric.MeasurementOption
	byOutcome metric.MeasurementOption
}

type attrKey struct {
	name    string
	op      string
	outcome string
}

// attrs returns the attribute sets of e. Without WithKeys they are built
// once per (limit, op, outcome) and kept: their number is bounded by the
// limits' names, and building a set costs more than recording it.
func (o *Observer) attrs(e txlimit.Event, outcome string) *attrSets {
	k := attrKey{e.Name, e.Op, outcome}
	if !o.keys {
		if a, ok := o.cache.Load(k); ok {
			return a.(*attrSets)
		}
	}
	list := []attribute.KeyValue{AttrLimit.String(e.Name), AttrOp.String(e.Op)}
	if o.keys {
		list = append(list, AttrKey.String(e.Key))
	}
	a := &attrSets{base: metric.WithAttributeSet(attribute.NewSet(list...))}
	a.list = append(list, AttrOutcome.String(outcome))
	a.byOutcome = metric.WithAttributeSet(attribute.NewSet(a.list...))
	if !o.keys {
		o.cache.Store(k, a)
	}
	return a
}

func (o *Observer) span(ctx context.Context, e txlimit.Event, attrs []attribute.KeyValue, end time.Time) {
	attrs = append(attrs[:len(attrs):len(attrs)],
		attribute.Float64("txlimit.count", e.Count),
		attribute.Float64("txlimit.lock_wait", e.LockWait.Seconds()),
	)
	if e.Err == nil {
		attrs = append(attrs,
			attribute.Bool("txlimit.ok", e.Result.OK),
			attribute.Float64("txlimit.retry_after", e.Result.RetryAfter.Seconds()),
			attribute.Float64("txlimit.remaining", e.Result.Remaining),
		)
	}
	_, span := o.tracer.Start(ctx, "txlimit."+e.Op,
		trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...))
	if e.Err != nil {
		span.RecordError(e.Err, trace.WithTimestamp(end), trace.WithAttributes(AttrErrorType.String(e.ErrorKind)))
		if !e.FailedOpen {
			span.SetStatus(codes.Error, e.Err.Error())
		}
	}
	span.End(trace.WithTimestamp(end))
}
