package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// testRedis is the address of the Redis the tests run the Redis limiter on:
// TEST_REDIS_ADDR, else 127.0.0.1:6379 (scripts/redis.sh starts one). When
// it does not answer the test fails under CI=true and is skipped otherwise.
func testRedis(t *testing.T) string {
	addr := os.Getenv("TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		msg := fmt.Sprintf("no Redis at %s (%v): start one with scripts/redis.sh, or set TEST_REDIS_ADDR", addr, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED: " + msg)
	}
	return addr
}

// redisKeys counts the keys on addr that match pattern.
func redisKeys(t *testing.T, addr, pattern string) int {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	n := 0
	iter := rdb.Scan(context.Background(), 0, pattern, 1000).Iterator()
	for iter.Next(context.Background()) {
		n++
	}
	require.NoError(t, iter.Err())
	return n
}

// TestQuickRun runs the command's smoke run against the test database and
// Redis: it must measure every cell of every implementation, pass every
// admission check, write its four files, drop its schema and delete its
// Redis keys.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the smoke run takes about 30s; skipped under -short")
	}
	dsn := testdb.URL(t)
	addr := testRedis(t)
	out := filepath.Join(t.TempDir(), "bench")
	cfg, err := parseFlags([]string{"-dsn", dsn, "-redis", addr, "-quick", "-out", out}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	rep, err := run(context.Background(), cfg, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)

	// Every cell: on PostgreSQL, at 3 client counts, the floor, txlimit
	// and txlimit/pgsqlstore in 5 scenarios (distinct, hot, 3 shard
	// counts), the business scenario with none, floor, both txlimit
	// stores, txlimit/commit with and without a lease, txlimit/batch,
	// redis and redis_rate, business-hot with floor, txlimit,
	// txlimit/shards16, both txlimit/commit, txlimit/batch, redis and
	// redis_rate, and tpcb and tpcb-hot each with none, txlimit, both
	// txlimit/commit, txlimit/batch, redis and redis_rate, and slots and
	// slots-hot each with txlimit/slot and redis/semaphore; on SQLite, at
	// 2, the floor and txlimit in distinct and hot.
	const pgRows, sqliteRows = (5*3 + 9 + 8 + 2*7 + 2*2) * 3, 2 * 2 * 2
	require.Len(t, rep.Rows, pgRows+sqliteRows)
	impls := map[string]int{}
	for _, r := range rep.Rows {
		what := fmt.Sprintf("%s %s %s %d", r.DB, r.Scenario, r.Impl, r.Clients)
		impls[r.DB+" "+r.Impl]++
		require.Positive(t, r.OpsPerSec, what)
		require.Len(t, r.Runs, 1)
		tpcb := strings.HasPrefix(r.Scenario, "tpcb")
		slots := strings.HasPrefix(r.Scenario, "slots")
		require.Equal(t, slots, r.Impl == implSlot || r.Impl == implRedisSemaphore, "%s: the slot subjects run in the slot scenarios, and only there", what)
		require.Equal(t, strings.HasPrefix(r.Scenario, "business") || tpcb || slots, r.Business, what)
		if r.Impl != implFloor && !tpcb && !slots {
			require.Positive(t, r.VsFloor, "%s has a floor to compare with", what)
		}
		if tpcb && r.Impl != implNone {
			require.Positive(t, r.VsNone, "%s is compared with no limit", what)
		}
		if tpcb && r.Impl != implRedisRate {
			require.Positive(t, r.VsRedisRate, "%s is compared with redis_rate", what)
		}
		// txlimit/shards16 runs on the hot key only: it is compared with
		// LimitTx on distinct keys, which need no shards.
		if strings.HasPrefix(r.Scenario, "hot") || strings.HasSuffix(r.Scenario, "-hot") {
			require.Positive(t, r.VsDistinct, "%s is compared with distinct keys", what)
		} else {
			require.Zero(t, r.VsDistinct, what)
		}
		if r.Shards > 1 && r.Impl == implTxlimit {
			require.Positive(t, r.VsHotFloor, "%s is compared with the unsharded hot floor", what)
		}
		if r.Scenario == "business-hot" && r.Impl != implFloor {
			require.Positive(t, r.VsHotFloor, "%s is compared with the floor on the hot row", what)
		}
		if r.Impl == implNone {
			require.Zero(t, r.StepP50Ms, "%s has no limit step", what)
		} else {
			require.Positive(t, r.StepP50Ms, what)
			require.GreaterOrEqual(t, r.StepP99Ms, r.StepP50Ms, what)
			require.Less(t, r.StepP50Ms, r.P50Ms+r.P99Ms, "%s: the step is part of the call", what)
		}
		switch {
		case r.Impl == implSlot:
			// The slot against the Redis semaphore, throughput and the
			// step (acquire and release).
			require.Positive(t, r.VsSemaphore, "%s is compared with the Redis semaphore", what)
			require.Positive(t, r.StepVsSemaphore, what)
		default:
			require.Zero(t, r.VsSemaphore, what)
		}
		if r.Business && r.Impl != implRedis && !slots {
			require.Positive(t, r.VsRedis, "%s is compared with Redis", what)
			if r.Impl != implNone {
				require.Positive(t, r.StepVsRedis, what)
				require.Positive(t, r.StepP99VsRedis, what)
			}
		} else {
			require.Zero(t, r.VsRedis, what)
		}
		if r.DB != "postgres" {
			continue
		}
		// Round trips per call, BEGIN, the work (the business INSERT, or
		// the tpcb-like transaction's five statements) and COMMIT
		// included. txlimit's own count is TestRoundTrips's to pin (in
		// the root module): here only that it sends at least one.
		business := 0.0
		switch {
		case tpcb:
			business = 5
		case r.Business:
			business = 1
		}
		switch {
		case r.Impl == implNone:
			require.Equal(t, 2+business, r.RoundTrips, what)
		case r.Impl == implCommit:
			// BEGIN, the work, and the take with the COMMIT: the round
			// trips of the transaction with no limit.
			require.Equal(t, 2+business, r.RoundTrips, what)
		case r.Impl == implBatch:
			// BEGIN, the take and the work's first statement in one
			// batch, the rest of the work, COMMIT: the round trips of the
			// transaction with no limit.
			require.Equal(t, 2+business, r.RoundTrips, what)
		case r.Impl == implCommitLease:
			// BEGIN, the work, COMMIT, and a lease's own short
			// transaction once every 64 calls.
			require.GreaterOrEqual(t, r.RoundTrips, 2+business, what)
			require.Less(t, r.RoundTrips, 2.5+business, what)
		case r.Impl == implRedis || r.Impl == implRedisRate:
			// EVALSHA; a SCRIPT FLUSH by another user of the shared Redis
			// would add one EVAL per connection.
			require.InDelta(t, 3+business, r.RoundTrips, 0.05, what)
		case r.Impl == implRedisSemaphore:
			// BEGIN, INSERT, EVALSHA (the acquire), COMMIT, ZREM.
			require.InDelta(t, 4+business, r.RoundTrips, 0.05, what)
		case r.Impl == implSlot:
			// BEGIN, INSERT, the acquire, COMMIT; BEGIN, the release,
			// COMMIT.
			require.GreaterOrEqual(t, r.RoundTrips, 6+business, what)
		case r.Impl == implFloor && r.Shards == 1:
			require.Equal(t, 4.0+business, r.RoundTrips, what)
		case r.Impl == implFloor:
			// The sharded floor sends one more when it waits for a shard.
			require.GreaterOrEqual(t, r.RoundTrips, 4.0, what)
		default:
			require.GreaterOrEqual(t, r.RoundTrips, 3.0+business, what)
		}
	}
	require.Equal(t, map[string]int{
		"postgres none": 3 * 3, "postgres floor": 7 * 3, "postgres txlimit": 9 * 3, "postgres txlimit/pgsqlstore": 6 * 3,
		"postgres txlimit/shards16": 3, "postgres redis": 4 * 3, "postgres txlimit/commit": 4 * 3,
		"postgres txlimit/commit+lease": 4 * 3, "postgres txlimit/batch": 4 * 3, "postgres redis_rate": 4 * 3,
		"postgres txlimit/slot": 2 * 3, "postgres redis/semaphore": 2 * 3,
		"sqlite floor": 4, "sqlite txlimit": 4,
	}, impls)

	// One all-admitted check per timed run but none's; the saturating
	// checks at the largest client count: exact and bounded for the floor
	// (4 scenarios: the sharded floor, which does not pool, left out),
	// txlimit (9), txlimit/pgsqlstore (6: not business-hot, not tpcb),
	// txlimit/shards16 (business-hot), txlimit/commit with and without a
	// lease and txlimit/batch (business, business-hot, tpcb, tpcb-hot),
	// window for Redis in distinct, hot, business, business-hot, tpcb and
	// tpcb-hot, bounded for redis_rate in the four business scenarios, and
	// the slots held at once on the hot key for txlimit/slot and
	// redis/semaphore. (The timed runs of the slot subjects check that
	// every call was granted and every slot is free again.)
	const timed = pgRows + sqliteRows - 3*3
	const saturating = 2*(4+9+6+1+4+4+4) + 6 + 4 + 2*2*2 + 2
	require.Len(t, rep.Checks, timed+saturating)
	kinds := map[string]int{}
	for _, c := range rep.Checks {
		require.True(t, c.OK, "%s: %s", c.Name, c.Detail)
		kind, _, _ := strings.Cut(c.Name, "/")
		kinds[kind]++
	}
	require.Equal(t, 6, kinds["window"], "Redis takes the window check in distinct, hot and the four business scenarios")
	require.Equal(t, 2, kinds["slots"], "txlimit/slot and redis/semaphore take the slots check in slots-hot")
	for _, impl := range []string{implSlot, implRedisSemaphore} {
		name := "slots/postgres/slots-hot/" + impl + "/c32"
		i := slices.IndexFunc(rep.Checks, func(c check) bool { return c.Name == name })
		require.GreaterOrEqual(t, i, 0, "%s takes the slots check", impl)
		require.Contains(t, rep.Checks[i].Detail, fmt.Sprintf("at most %d held a slot at once", slotCapacity))
	}
	require.Equal(t, pgRows+sqliteRows-3*3, kinds["postgres"]+kinds["sqlite"], "a timed check per row but none's")
	require.Equal(t, 4+9+6+1+4+4+4+2*2, kinds["exact"], "the floor (4 scenarios), txlimit (9), txlimit/pgsqlstore (6), txlimit/shards16 (1), both txlimit/commit and txlimit/batch (4 each), SQLite's two (2 each)")
	require.Equal(t, 4+9+6+1+4+4+4+4+2*2, kinds["bounded"], "as exact, and redis_rate (4)")
	for _, kind := range []string{"exact", "bounded"} {
		require.True(t, slices.ContainsFunc(rep.Checks, func(c check) bool { return c.Name == kind+"/postgres/business-hot/txlimit/shards16/c32" }),
			"txlimit/shards16 takes the %s check in business-hot", kind)
	}
	require.Contains(t, stdout.String(), fmt.Sprintf("admission checks: %d passed, 0 failed", len(rep.Checks)))
	// Distinct keys at 3 client counts, the 16-shard key at 32, the limit
	// step against Redis at 3; the take at commit against redis_rate at 3
	// and no limit at 1, and on the hot key with a lease against
	// redis_rate and its distinct keys at 8 and 32; txlimit's four exact
	// modes against no limit in tpcb and tpcb-hot at 1 and 8.
	// And the slot against the Redis semaphore on distinct keys at 1.
	require.Len(t, rep.Targets, 7+4+4+4*2*2+1)
	require.True(t, slices.ContainsFunc(rep.Targets, func(tg Target) bool {
		return tg.Name == "postgres slots, 1 client: acquire + release in the business transaction >= 1.0x the Redis semaphore beside it" && tg.Got > 0
	}))
	for _, target := range rep.Targets {
		if strings.Contains(target.Name, "16 shards") {
			require.Positive(t, target.FloorGot, "the shards target shows what the floor reaches")
		}
		require.Positive(t, target.Got, target.Name)
		require.Equal(t, strings.Contains(target.Name, "limit step"), target.AtMost, target.Name)
	}
	require.Contains(t, rep.Redis, "Redis ")
	require.Zero(t, redisKeys(t, addr, rep.redisKeys), "every Redis key of the run (%s) is deleted", rep.redisKeys)

	f, err := os.Open(filepath.Join(out, "results.csv"))
	require.NoError(t, err)
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, records, 1+len(rep.Rows))
	require.Equal(t, "ops_per_sec", records[0][5])
	require.Contains(t, records[0], "step_p50_vs_redis")
	require.Contains(t, records[0], "vs_redis_semaphore")

	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(data, &back))
	require.Equal(t, rep.Rows, back.Rows)
	require.Equal(t, rep.Checks, back.Checks)

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "## The limit step inside a business transaction")
	require.Contains(t, string(md), "| postgres | business | redis | 32 |")
	require.Contains(t, string(md), "| postgres | business-hot | txlimit/shards16 | 32 |")
	require.Contains(t, string(md), "## Concurrency slots around a business transaction")
	require.Contains(t, string(md), "| slots-hot | txlimit/slot | 32 |")
	require.Contains(t, string(md), fmt.Sprintf("%d passed, 0 failed", len(rep.Checks)))

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

func (m *memory) newClient(_ context.Context, spec limitSpec, key string, _ work) (client, error) {
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

func (c memClient) take(context.Context) (call, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	b := c.m.bucket(c.spec, c.key)
	now := c.spec.now()
	left := c.spec.project(b.value, b.ts, now) - 1
	floor := 0.0
	switch c.m.lie {
	case "admit":
		return call{ok: true}, nil
	case "deny":
		return call{}, nil
	case "overdraw":
		floor = -1
	}
	if left < floor {
		return call{}, nil
	}
	b.value, b.ts = left, now
	return call{ok: true}, nil
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
	require.Equal(t, "127.0.0.1:6379", cfg.Redis, "Redis is measured by default")

	cfg, err = parseFlags([]string{"-dsn", "postgres://x", "-redis="}, io.Discard)
	require.NoError(t, err)
	require.Empty(t, cfg.Redis, "-redis= leaves Redis out")
	require.Nil(t, cfg.Subjects, "every subject by default")
	require.True(t, cfg.wants(implShards16))

	cfg, err = parseFlags([]string{"-dsn", "postgres://x", "-subjects", " floor,txlimit/shards16 ,redis,floor"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{implFloor, implShards16, implRedis}, cfg.Subjects)
	require.False(t, cfg.wants(implTxlimit))

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-subjects", "floor,shards16"}, io.Discard)
	require.ErrorContains(t, err, `-subjects: unknown subject "shards16"; name some of none, floor, txlimit, txlimit/pgsqlstore, txlimit/shards16, txlimit/commit, txlimit/commit+lease, txlimit/batch, redis, redis_rate, txlimit/slot, redis/semaphore`)

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-subjects", ","}, io.Discard)
	require.ErrorContains(t, err, "names no subject")

	_, err = parseFlags([]string{"-dsn", "postgres://x", "-subjects", "redis", "-redis="}, io.Discard)
	require.ErrorContains(t, err, "-redis= leaves Redis out")
}

// TestCheckWindowRejectsWrongAnswers feeds the fixed-window check the
// outcomes of right and wrong window counters: it passes exactly Capacity a
// key in one window, at most Capacity a window across two, and counters
// that saw every call; it fails the rest.
func TestCheckWindowRejectsWrongAnswers(t *testing.T) {
	spec := windowSpec("window")
	// stats is a run of two keys that granted a and b of ops calls, whose
	// counters hold counted calls in all.
	stats := func(a, b, ops, counted int64, allDenied bool) runStats {
		return runStats{
			ops: ops, admitted: a + b, allDenied: allDenied,
			perKey: map[string]int64{"k0": a, "k1": b},
			values: map[string]float64{"k0": spec.Capacity - float64(counted-counted/2), "k1": spec.Capacity - float64(counted/2)},
		}
	}
	one := map[string]int{"k0": 1, "k1": 1}
	for name, tc := range map[string]struct {
		st      runStats
		windows map[string]int
		ok      bool
	}{
		"right":                            {stats(100, 100, 202, 202, true), one, true},
		"right, one key in two windows":    {stats(150, 100, 252, 252, true), map[string]int{"k0": 2, "k1": 1}, true},
		"one too many in one window":       {stats(101, 100, 203, 203, true), one, false},
		"one too few":                      {stats(99, 100, 201, 201, true), one, false},
		"more than a window's in two":      {stats(201, 100, 303, 303, true), map[string]int{"k0": 2, "k1": 1}, false},
		"a call the counters did not see":  {stats(100, 100, 202, 201, true), one, false},
		"never denied: demand too small":   {stats(100, 100, 200, 200, false), one, false},
		"no window known counts as one":    {stats(101, 100, 203, 203, true), map[string]int{}, false},
		"counters saw more than was made":  {stats(100, 100, 202, 204, true), one, false},
		"two windows, each key at its cap": {stats(200, 200, 402, 402, true), map[string]int{"k0": 2, "k1": 2}, true},
	} {
		t.Run(name, func(t *testing.T) {
			c := checkWindow("window", spec, tc.st, tc.windows)
			require.Equal(t, tc.ok, c.OK, c.Detail)
		})
	}
}

// TestRedisLimit runs the Redis subject on its own: 16 clients on one key
// beside business transactions admit exactly the window's capacity, the
// denied calls roll their order back, the step is timed, and every key of
// the run is deleted at the end.
func TestRedisLimit(t *testing.T) {
	ctx := context.Background()
	addr := testRedis(t)
	env, drop, err := openPostgres(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(drop)
	p, err := env.pool(ctx, 16, false)
	require.NoError(t, err)
	t.Cleanup(p.close)
	rds, cleanup, err := openRedis(ctx, addr, 18)
	require.NoError(t, err)
	rds.trace.Store(p.trace)
	subj := redisLimit{env: rds, p: p}

	hot := scenario{name: "hot", hot: true, shards: 1}.keys(16)
	spec := windowSpec("window/hot")
	st, err := drive(ctx, subj, spec, workload{keys: hot, maxOps: 10 * exactCapacity, work: orderWork})
	require.NoError(t, err)
	c := checkWindow(spec.Name, spec, st, map[string]int{"hot": subj.windows(spec, "hot")})
	require.True(t, c.OK, c.Detail)
	require.Equal(t, int64(16), st.ops-st.admitted, "each of the 16 clients stopped at its first denial")
	require.Len(t, st.stepLat, int(st.ops))
	for _, d := range st.stepLat {
		require.Positive(t, d)
	}
	// Every admitted call committed its order; every denied one rolled it
	// back.
	var orders int64
	require.NoError(t, p.pool.QueryRow(ctx, `SELECT count(*) FROM bench_orders WHERE k = 'hot'`).Scan(&orders))
	require.Equal(t, st.admitted, orders)
	// One EVALSHA a call (an EVAL more the first time the script runs on
	// a Redis that has not cached it yet), beside BEGIN, INSERT and COMMIT
	// (or ROLLBACK) on PostgreSQL.
	require.GreaterOrEqual(t, p.trace.redis.Load(), st.ops)
	require.LessOrEqual(t, p.trace.redis.Load(), st.ops+16+2*int64(len(hot))+2, "EVALSHA per call, TIME per client and value read")

	// An injected clock cannot drive Redis's.
	_, err = subj.newClient(ctx, exactSpec("frozen", 1), "k", noWork)
	require.ErrorContains(t, err, "Redis's clock")

	pattern := rds.pattern()
	require.Positive(t, redisKeys(t, addr, pattern))
	cleanup()
	require.Zero(t, redisKeys(t, addr, pattern), "cleanup deletes every key of the run")
}

// TestSubjectsRun runs only the floor and txlimit/shards16 (-subjects),
// without Redis or SQLite: only their rows and checks are there, and the
// sharded hot key is still compared with the floor on the hot row.
func TestSubjectsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a short run against PostgreSQL; skipped under -short")
	}
	cfg, err := parseFlags([]string{"-dsn", testdb.URL(t), "-redis=", "-sqlite=false", "-quick",
		"-clients", "8", "-shards", "", "-subjects", "txlimit/shards16,floor"}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	rep, err := run(context.Background(), cfg, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	impls := map[string]int{}
	for _, r := range rep.Rows {
		impls[r.Scenario+" "+r.Impl]++
	}
	require.Equal(t, map[string]int{
		"distinct floor": 1, "hot floor": 1, "business floor": 1, "business-hot floor": 1,
		"business-hot txlimit/shards16": 1,
	}, impls)
	// A timed check per row; exact and bounded for the floor in 4
	// scenarios and for txlimit/shards16 in 1.
	require.Len(t, rep.Checks, 5+2*(4+1))
	for _, r := range rep.Rows {
		if r.Impl == implShards16 {
			require.Positive(t, r.VsHotFloor, "compared with the floor on the hot row")
			require.Zero(t, r.VsRedis, "Redis is not measured")
		}
	}
	require.Contains(t, stdout.String(), "subjects: txlimit/shards16, floor")
}

// TestMySQLSubjects runs the MySQL subjects in a smoke run: the floor,
// txlimit on mysqlstore and the business transaction with no limit, on
// distinct keys and one hot key, alone and in the business transaction,
// each with its ratio to the floor and its admission checks, on the server
// of TEST_MYSQL_DSN or the local one (a skip without one, a failure under
// CI=true); its database is dropped at the end.
func TestMySQLSubjects(t *testing.T) {
	if testing.Short() {
		t.Skip("a short run against MySQL; skipped under -short")
	}
	dsn := testMySQL(t)
	cfg, err := parseFlags([]string{"-dsn", testdb.URL(t), "-redis=", "-sqlite=false", "-quick", "-clients", "1", "-shards", "",
		"-subjects", "none,floor,txlimit", "-mysql", dsn, "-mysql-clients", "1,8"}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	rep, err := run(context.Background(), cfg, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	require.NotEmpty(t, rep.MySQL)
	cells := map[string]int{}
	for _, r := range rep.Rows {
		if r.DB != "mysql" {
			continue
		}
		cells[r.Scenario+" "+r.Impl]++
		require.Positive(t, r.OpsPerSec, "%s %s %d", r.Scenario, r.Impl, r.Clients)
		if r.Impl == implTxlimit {
			require.Positive(t, r.VsFloor, "%s %d: a ratio to the floor", r.Scenario, r.Clients)
		}
	}
	require.Equal(t, map[string]int{
		"distinct floor": 2, "distinct txlimit": 2, "hot floor": 2, "hot txlimit": 2,
		"business none": 2, "business floor": 2, "business txlimit": 2,
		"business-hot floor": 2, "business-hot txlimit": 2,
	}, cells)
	var checks, targets int
	for _, c := range rep.Checks {
		if strings.Contains(c.Name, "/mysql/") {
			checks++
			require.True(t, c.OK, "%s: %s", c.Name, c.Detail)
		}
	}
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "mysql distinct keys") {
			targets++
		}
	}
	require.Positive(t, checks, "admission checks ran on MySQL")
	require.Equal(t, 2, targets, "one floor target per client count")
	var left int
	cfgDSN, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	db, err := sql.Open("mysql", cfgDSN.FormatDSN())
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE 'txlimit\\_bench\\_%'").Scan(&left))
	require.Zero(t, left, "the run drops its database")
}

// testMySQL returns the DSN of the MySQL server to test against:
// TEST_MYSQL_DSN, else the local one. Without one the test skips, except
// under CI=true, where it fails.
func testMySQL(t *testing.T) string {
	t.Helper()
	dsn := cmp.Or(os.Getenv("TEST_MYSQL_DSN"), "root:@tcp(127.0.0.1:3306)/test")
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("MySQL or MariaDB is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING: no MySQL or MariaDB (set TEST_MYSQL_DSN or run scripts/mariadb.sh): %v", err)
	}
	return dsn
}
