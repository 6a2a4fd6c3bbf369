// Package promobserver exports what a txlimit.Limiter decides as Prometheus
// metrics (client_golang collectors). It is a module of its own
// (github.com/txlimit/txlimit/promobserver), so that client_golang stays out
// of the dependency graph of applications that do not use it.
//
//	obs, err := promobserver.New(prometheus.DefaultRegisterer, nil)
//	if err != nil { … }
//	limiter, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Observer: obs.Observe})
//
// # Metrics
//
// With the default namespace, txlimit, every Event of the Limiter (every
// call of Limit, Check, LimitAll, Commit and the others, with their Tx
// forms) records:
//
//   - txlimit_decisions_total{limit, op, outcome}: one per Event. The
//     outcome is Event.Outcome: allowed, reserved, denied, failed_open or
//     error; op is Event.Op: limit, check, limit_all, commit and so on. A LimitAll call counts once per
//     limit it names (once in all when it failed before deciding).
//   - txlimit_call_duration_seconds{limit, op, outcome} (histogram):
//     Event.Duration, how long the caller waited.
//   - txlimit_lock_wait_seconds{limit, op} (histogram): Event.LockWait, the
//     part of the call spent in the statements that lock the limit's rows. A
//     lock wait close to the call's duration on a busy limit is the sign that
//     it needs Shards.
//   - txlimit_errors_total{limit, op, kind}: one per Event with an error,
//     including those Options.FailOpen turned into grants; kind is
//     txlimit.Event.ErrorKind: invalid (bad input, an unknown limit, a
//     store without a pool), not_migrated, canceled, deadline_exceeded or
//     database.
//
// The histograms' buckets are DurationBuckets (0.5 ms to 10 s) unless
// Options.Buckets says otherwise.
//
// Keys are not labels by default: a limit per user or per IP address has as
// many keys as there are users or addresses, and every label value is a time
// series that the process keeps in memory forever and Prometheus stores.
// Options.Keys adds a key label; use it only for limits with a handful of
// keys.
package promobserver

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txlimit/txlimit"
)

// DurationBuckets are the default histogram buckets, in seconds: from a fast
// call on a local database to a call that waited seconds for a hot row.
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Options configures New. A nil *Options is the zero value.
type Options struct {
	// Namespace prefixes every metric name. Defaults to "txlimit".
	Namespace string
	// ConstLabels are added to every metric, for example the name of the
	// database. Defaults to none.
	ConstLabels prometheus.Labels
	// Buckets are the buckets of both histograms, in seconds. Defaults to
	// DurationBuckets.
	Buckets []float64
	// Keys adds a key label with Event.Key to every metric: a time series
	// per key. Defaults to false.
	Keys bool
}

// Observer updates Prometheus collectors with the Events its Observe method
// is given: pass obs.Observe as txlimit.Options.Observer. It is safe for
// concurrent use.
type Observer struct {
	keys      bool
	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	lockWait  *prometheus.HistogramVec
	errors    *prometheus.CounterVec
}

// New returns an Observer whose collectors are registered on reg (nil means
// prometheus.DefaultRegisterer). It returns the registration error, for
// example a prometheus.AlreadyRegisteredError when an Observer with the
// same options is registered already (give a second Observer on the same
// registry another Namespace); it then leaves reg as it was.
func New(reg prometheus.Registerer, opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = "txlimit"
	}
	if o.Buckets == nil {
		o.Buckets = DurationBuckets
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	labels := []string{"limit", "op"}
	if o.Keys {
		labels = append(labels, "key")
	}
	with := func(l string) []string { return append(labels[:len(labels):len(labels)], l) }
	obs := &Observer{
		keys: o.Keys,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "decisions_total", ConstLabels: o.ConstLabels,
			Help: "Calls of a txlimit Limiter by limit, operation and outcome (allowed, reserved, denied, failed_open, error).",
		}, with("outcome")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Name: "call_duration_seconds", ConstLabels: o.ConstLabels, Buckets: o.Buckets,
			Help: "How long a txlimit call took, as its caller waited for it.",
		}, with("outcome")),
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Name: "lock_wait_seconds", ConstLabels: o.ConstLabels, Buckets: o.Buckets,
			Help: "The part of a txlimit call spent in the statements that lock the limit's rows, waiting for other transactions included.",
		}, labels),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "errors_total", ConstLabels: o.ConstLabels,
			Help: "Errors of txlimit calls, failed-open ones included, by kind (invalid, not_migrated, canceled, deadline_exceeded, database).",
		}, with("kind")),
	}
	collectors := []prometheus.Collector{obs.decisions, obs.duration, obs.lockWait, obs.errors}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return obs, nil
}

// Observe records e. Its signature is txlimit.Options.Observer's.
func (o *Observer) Observe(_ context.Context, e txlimit.Event) {
	var buf [4]string
	values := append(buf[:0], e.Name, e.Op)
	if o.keys {
		values = append(values, e.Key)
	}
	n := len(values)
	withOutcome := append(values, e.Outcome)
	o.decisions.WithLabelValues(withOutcome...).Inc()
	o.duration.WithLabelValues(withOutcome...).Observe(e.Duration.Seconds())
	o.lockWait.WithLabelValues(values[:n]...).Observe(e.LockWait.Seconds())
	if e.Err != nil {
		o.errors.WithLabelValues(append(values[:n], e.ErrorKind)...).Inc()
	}
}
