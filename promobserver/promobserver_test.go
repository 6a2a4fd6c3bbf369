package promobserver_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/observertest"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/promobserver"
	"github.com/txlimit/txlimit/sqlitestore"
)

func TestMetricsSQLite(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	obs, err := promobserver.New(reg, nil)
	require.NoError(t, err)
	observertest.RunScenario(t, sqlitestore.New(observertest.SQLite(t, true)), sqlitestore.New(observertest.SQLite(t, false)), sqlitestore.New(observertest.ClosedSQLite(t)), obs)
	checkMetrics(t, reg, "txlimit")
}

func TestMetricsPostgres(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	obs, err := promobserver.New(reg, &promobserver.Options{Namespace: "app_ratelimit"})
	require.NoError(t, err)
	observertest.RunScenario(t, pgstore.New(observertest.Postgres(t, true)), pgstore.New(observertest.Postgres(t, false)), pgstore.New(observertest.ClosedPostgres(t)), obs)
	checkMetrics(t, reg, "app_ratelimit")
}

// checkMetrics scrapes reg after runScenario and checks every count.
func checkMetrics(t *testing.T, reg *prometheus.Registry, ns string) {
	t.Helper()
	// The counters, exactly, in the exposition format a scrape returns.
	var want strings.Builder
	fmt.Fprintf(&want, "# HELP %s_decisions_total Calls of a txlimit Limiter by limit, operation and outcome (allowed, reserved, denied, failed_open, error).\n# TYPE %[1]s_decisions_total counter\n", ns)
	for _, l := range sortedKeys(observertest.WantDecisions) {
		f := strings.Fields(l)
		fmt.Fprintf(&want, "%s_decisions_total{limit=%q,op=%q,outcome=%q} %d\n", ns, f[0], f[1], f[2], observertest.WantDecisions[l])
	}
	fmt.Fprintf(&want, "# HELP %s_errors_total Errors of txlimit calls, failed-open ones included, by kind (invalid, not_migrated, canceled, deadline_exceeded, database).\n# TYPE %[1]s_errors_total counter\n", ns)
	for _, l := range sortedKeys(observertest.WantErrors) {
		f := strings.Fields(l)
		fmt.Fprintf(&want, "%s_errors_total{kind=%q,limit=%q,op=%q} %d\n", ns, f[2], f[0], f[1], observertest.WantErrors[l])
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want.String()), ns+"_decisions_total", ns+"_errors_total"))

	// The histograms: one observation per decision, by the same labels, and
	// one lock wait per decision, by limit and op.
	families, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	require.Len(t, byName, 4)
	durations := map[string]int64{}
	for _, m := range byName[ns+"_call_duration_seconds"].GetMetric() {
		h := m.GetHistogram()
		durations[labels(m, "limit", "op", "outcome")] += int64(h.GetSampleCount())
		require.Len(t, h.GetBucket(), len(promobserver.DurationBuckets))
		require.Greater(t, h.GetSampleSum(), 0.0)
	}
	require.Equal(t, observertest.WantDecisions, durations)
	wantLockWaits := map[string]int64{}
	for k, n := range observertest.WantDecisions {
		f := strings.Fields(k)
		wantLockWaits[f[0]+" "+f[1]] += n
	}
	lockWaits := map[string]int64{}
	for _, m := range byName[ns+"_lock_wait_seconds"].GetMetric() {
		lockWaits[labels(m, "limit", "op")] += int64(m.GetHistogram().GetSampleCount())
		require.GreaterOrEqual(t, m.GetHistogram().GetSampleSum(), 0.0)
	}
	require.Equal(t, wantLockWaits, lockWaits)
}

// labels renders m's labels, which must be exactly names, as their values
// joined by spaces.
func labels(m *dto.Metric, names ...string) string {
	got := map[string]string{}
	for _, p := range m.GetLabel() {
		got[p.GetName()] = p.GetValue()
	}
	var out []string
	for _, n := range names {
		out = append(out, got[n])
	}
	if len(got) != len(names) {
		return fmt.Sprintf("unexpected labels %v", got)
	}
	return strings.Join(out, " ")
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestKeysAndRegistration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	obs, err := promobserver.New(reg, &promobserver.Options{Keys: true, ConstLabels: prometheus.Labels{"db": "main"}})
	require.NoError(t, err)
	l, err := txlimit.New(sqlitestore.New(observertest.SQLite(t, true)), map[string]txlimit.Config{
		"send": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
	}, &txlimit.Options{Clock: observertest.Frozen(), Observer: obs.Observe})
	require.NoError(t, err)
	for _, key := range []string{"alice", "alice", "bob"} {
		_, err := l.Limit(ctx, "send", key)
		require.NoError(t, err)
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP txlimit_decisions_total Calls of a txlimit Limiter by limit, operation and outcome (allowed, reserved, denied, failed_open, error).
# TYPE txlimit_decisions_total counter
txlimit_decisions_total{db="main",key="alice",limit="send",op="limit",outcome="allowed"} 1
txlimit_decisions_total{db="main",key="alice",limit="send",op="limit",outcome="denied"} 1
txlimit_decisions_total{db="main",key="bob",limit="send",op="limit",outcome="allowed"} 1
`), "txlimit_decisions_total"))

	// A second Observer under the same names is refused, with the
	// registry's error; another namespace is fine.
	_, err = promobserver.New(reg, &promobserver.Options{Keys: true, ConstLabels: prometheus.Labels{"db": "main"}})
	var already prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &already)
	_, err = promobserver.New(reg, nil) // other labels under the same names
	require.Error(t, err)
	_, err = promobserver.New(reg, &promobserver.Options{Namespace: "other"})
	require.NoError(t, err)

	// A failed New leaves the registry as it was: with the last of its
	// names taken, the first three are registered and then unregistered.
	reg2 := prometheus.NewRegistry()
	taken := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "txlimit_errors_total",
		Help: "Errors of txlimit calls, failed-open ones included, by kind (invalid, not_migrated, canceled, deadline_exceeded, database).",
	}, []string{"limit", "op", "kind"})
	require.NoError(t, reg2.Register(taken))
	_, err = promobserver.New(reg2, nil)
	require.ErrorAs(t, err, &already)
	require.True(t, reg2.Unregister(taken))
	_, err = promobserver.New(reg2, nil)
	require.NoError(t, err)
}
