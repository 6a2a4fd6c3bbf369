package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testdb"
)

// TestQuickRun runs the command's smoke run against the test database: it
// must measure every cell, pass every admission check, write its three
// files, and drop its schema.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the smoke run takes about 20s; skipped under -short")
	}
	dsn := testdb.URL(t)
	out := filepath.Join(t.TempDir(), "bench")
	cfg, err := parseFlags([]string{"-dsn", dsn, "-quick", "-out", out}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	rep, err := run(context.Background(), cfg, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)

	// Every cell: PostgreSQL 5 scenarios, each with a floor, at 3 client
	// counts, SQLite 2 scenarios with a floor at 2.
	require.Len(t, rep.Rows, 10*3+4*2)
	for _, r := range rep.Rows {
		require.Positive(t, r.OpsPerSec, "%s %s %s %d", r.DB, r.Scenario, r.Impl, r.Clients)
		require.Len(t, r.Runs, 1)
		if r.Impl == "txlimit" {
			require.Positive(t, r.VsFloor, "%s %s %d has a floor to compare with", r.DB, r.Scenario, r.Clients)
		}
		if r.Scenario != "distinct" {
			require.Positive(t, r.VsDistinct, "%s %s %s %d is compared with distinct keys", r.DB, r.Scenario, r.Impl, r.Clients)
		}
		if r.Shards > 1 && r.Impl == "txlimit" {
			require.Positive(t, r.VsHotFloor, "%s %d is compared with the unsharded hot floor", r.Scenario, r.Clients)
		}
		if r.DB == "postgres" {
			// BEGIN, the call's statements, COMMIT: at least 3 round
			// trips (an admitted unsharded txlimit call is one
			// statement), exactly 4 for the unsharded floor (the sharded
			// one sends one more when it waits for a shard).
			require.GreaterOrEqual(t, r.RoundTrips, 3.0, "%s %s %d", r.Scenario, r.Impl, r.Clients)
			if r.Impl == "floor" && r.Shards == 1 {
				require.Equal(t, 4.0, r.RoundTrips)
			}
		}
	}
	// One all-admitted check per timed run, two saturating checks per
	// scenario and implementation, except the sharded floor, which does
	// not pool its shards.
	require.Len(t, rep.Checks, (10*3+4*2)+2*7+2*4)
	for _, c := range rep.Checks {
		require.True(t, c.OK, "%s: %s", c.Name, c.Detail)
	}
	require.Contains(t, stdout.String(), fmt.Sprintf("admission checks: %d passed, 0 failed", len(rep.Checks)))
	require.Len(t, rep.Targets, 4)
	for _, target := range rep.Targets {
		if strings.Contains(target.Name, "16 shards") {
			require.Positive(t, target.FloorGot, "the shards target shows what the floor reaches")
		}
	}

	f, err := os.Open(filepath.Join(out, "results.csv"))
	require.NoError(t, err)
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, records, 1+len(rep.Rows))
	require.Equal(t, "ops_per_sec", records[0][5])

	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(data, &back))
	require.Equal(t, rep.Rows, back.Rows)
	require.Equal(t, rep.Checks, back.Checks)

	svg, err := os.ReadFile(filepath.Join(out, "results.svg"))
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(svg))
	rects := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "results.svg is well-formed XML")
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "rect" {
			rects++
		}
	}
	// A background, a bar per row, a legend entry per client count.
	require.Equal(t, 1+len(rep.Rows)+3+2, rects)

	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var exists bool
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM information_schema.schemata WHERE schema_name = $1)`, rep.schema).Scan(&exists))
	require.False(t, exists, "schema %s is dropped", rep.schema)
}

// memory is a token bucket kept in memory, as a subject of the checks: right,
// or wrong in a given way.
type memory struct {
	mu      sync.Mutex
	buckets map[string]*memBucket
	// lie: "" answers right; "admit" grants without consuming; "deny"
	// denies everything; "overdraw" lets the bucket go to -1.
	lie string
}

type memBucket struct {
	value float64
	ts    time.Time
}

func (m *memory) bucket(spec limitSpec, key string) *memBucket {
	k := spec.Name + "/" + key
	b := m.buckets[k]
	if b == nil {
		b = &memBucket{value: spec.Capacity, ts: spec.now()}
		m.buckets[k] = b
	}
	return b
}

type memClient struct {
	m    *memory
	spec limitSpec
	key  string
}

func (m *memory) newClient(_ context.Context, spec limitSpec, key string) (client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bucket(spec, key)
	return memClient{m, spec, key}, nil
}

func (m *memory) value(_ context.Context, spec limitSpec, key string) (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.bucket(spec, key)
	return spec.project(b.value, b.ts, spec.now()), nil
}

func (c memClient) take(context.Context) (bool, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	b := c.m.bucket(c.spec, c.key)
	now := c.spec.now()
	left := c.spec.project(b.value, b.ts, now) - 1
	floor := 0.0
	switch c.m.lie {
	case "admit":
		return true, nil
	case "deny":
		return false, nil
	case "overdraw":
		floor = -1
	}
	if left < floor {
		return false, nil
	}
	b.value, b.ts = left, now
	return true, nil
}

func (memClient) close() {}

// TestChecksRejectWrongAnswers runs each admission check against a right
// in-memory bucket, which must pass, and against wrong ones, which must
// fail: the checks are what keeps a fast wrong answer out of the results.
func TestChecksRejectWrongAnswers(t *testing.T) {
	ctx := context.Background()
	keys := scenario{name: "distinct"}.keys(4)
	hot := scenario{name: "hot", hot: true}.keys(4)
	runChecks := func(t *testing.T, lie string) map[string]check {
		m := &memory{buckets: map[string]*memBucket{}, lie: lie}
		out := map[string]check{}
		for _, ks := range [][]string{keys, hot} {
			spec := timedSpec("timed", 1)
			st, err := drive(ctx, m, spec, workload{keys: ks, duration: 20 * time.Millisecond, warmUp: true})
			require.NoError(t, err)
			out["all admitted "+ks[0]] = checkAllAdmitted(spec.Name, spec, st)

			spec = exactSpec("exact", 1)
			st, err = drive(ctx, m, spec, workload{keys: ks, maxOps: 10 * exactCapacity})
			require.NoError(t, err)
			out["exact "+ks[0]] = checkExact(spec.Name, spec, st)

			spec = boundedSpec("bounded", 1)
			st, err = drive(ctx, m, spec, workload{keys: ks, duration: 20 * time.Millisecond, untilDenied: true})
			require.NoError(t, err)
			out["bounded "+ks[0]] = checkBounded(spec.Name, spec, st)
		}
		return out
	}

	for name, c := range runChecks(t, "") {
		require.True(t, c.OK, "a right bucket passes %s: %s", name, c.Detail)
	}
	wrong := map[string][]string{
		// Grants without consuming: the tokens left give it away, and a
		// saturating run never sees a denial.
		"admit": {"all admitted client0", "all admitted hot", "exact client0", "exact hot", "bounded client0", "bounded hot"},
		// Denies what it should grant.
		"deny": {"all admitted client0", "all admitted hot", "exact client0", "exact hot", "bounded client0", "bounded hot"},
		// Grants one token too many when it runs out.
		"overdraw": {"exact client0", "exact hot", "bounded client0", "bounded hot"},
	}
	for lie, failing := range wrong {
		t.Run(lie, func(t *testing.T) {
			got := runChecks(t, lie)
			for _, name := range failing {
				require.False(t, got[name].OK, "%s must fail for a bucket that lies (%s): %s", name, lie, got[name].Detail)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	_, err := parseFlags(nil, io.Discard)
	require.ErrorContains(t, err, "-dsn is required")

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-clients", "1,zero"}, io.Discard)
	require.ErrorContains(t, err, `-clients: "zero" is not a whole number`)

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-shards", "1"}, io.Discard)
	require.ErrorContains(t, err, "-shards")

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-duration", "0s"}, io.Discard)
	require.ErrorContains(t, err, "-duration must be > 0")

	_, err = parseFlags([]string{"-dsn", "postgres://x", "extra"}, io.Discard)
	require.ErrorContains(t, err, `unexpected argument "extra"`)

	cfg, err := parseFlags([]string{"-dsn=postgres://user:secret@host/db", "-clients", "32,1,8,8", "-quick"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{1, 8, 32}, cfg.Clients)
	require.Equal(t, 250*time.Millisecond, cfg.Duration)
	require.Equal(t, 1, cfg.Repeats)
	require.NotContains(t, cfg.Command, "secret", "the recorded command hides the DSN")
	require.True(t, strings.HasPrefix(cfg.Command, "txlimit-bench -dsn=…"))
}
