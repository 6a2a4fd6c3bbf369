package txlimit_test

// Go benchmarks of LimitTx against the hand-written SQL floor, and the count
// of round trips LimitTx costs. The full comparison at several client counts,
// with ratios and an admission check, is the command cmd/txlimit-bench; these
// benchmarks are the quick, go-test-native view of the same thing:
//
//	go test -run '^$' -bench 'LimitTx' -benchtime 3s .
//
// Every limit here admits everything (Capacity 1e12, refilled at the real
// rate of 1 token an hour, on the database clock), so the benchmarks time the
// work of an admission, and a denial fails the benchmark.

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// benchConns is the pool size and the number of goroutines of the
// PostgreSQL benchmarks: enough to queue on a hot row on a 2-core machine.
const benchConns = 16

// benchCapacity is never exhausted by a benchmark, so every call is admitted.
const benchCapacity = 1e12

func benchConfig(shards int) txlimit.Config {
	return txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: benchCapacity, Shards: shards}
}

// floorTake is the token bucket of benchConfig written by hand, as an
// application without txlimit would: it returns the new value, or false when
// the bucket lacks the token.
func floorTake(value float64, ts, now time.Time) (float64, bool) {
	elapsed := max(now.Sub(ts), 0)
	v := math.Min(value+elapsed.Hours(), benchCapacity) - 1
	return v, v >= 0
}

// The PostgreSQL floor (benchfloor): BEGIN; SELECT … FOR UPDATE; UPDATE;
// COMMIT.

func pgFloor(ctx context.Context, pool *pgxpool.Pool, key string) (bool, error) {
	var ok bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var value float64
		var ts time.Time
		if err := tx.QueryRow(ctx, benchfloor.PGSelect, key).Scan(&value, &ts); err != nil {
			return err
		}
		now := time.Now()
		var next float64
		if next, ok = floorTake(value, ts, now); !ok {
			return nil
		}
		_, err := tx.Exec(ctx, benchfloor.PGUpdate, key, next, now)
		return err
	})
	return ok, err
}

// benchKeys hands out the keys of one benchmark run: a key per goroutine for
// distinct keys, one shared key for a hot one. Every run gets keys of its
// own so that no run starts from the state another one left.
type benchKeys struct {
	run  string
	hot  bool
	next atomic.Int64
}

var benchRun atomic.Int64

func newBenchKeys(b *testing.B, hot bool) *benchKeys {
	return &benchKeys{run: fmt.Sprintf("%s#%d", b.Name(), benchRun.Add(1)), hot: hot}
}

func (k *benchKeys) key() string {
	if k.hot {
		return k.run + "/hot"
	}
	return fmt.Sprintf("%s/%d", k.run, k.next.Add(1))
}

// runParallel runs op from benchConns goroutines, each on a key from keys,
// and reports the throughput. A denial fails the benchmark: the limits here
// admit everything, so a denial means a wrong answer.
func runParallel(b *testing.B, keys func() *benchKeys, prepare func(key string) error, op func(key string) (bool, error)) {
	b.SetParallelism((benchConns + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	k := keys()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := k.key()
		if prepare != nil {
			if err := prepare(key); err != nil {
				b.Error(err)
				return
			}
		}
		for pb.Next() {
			ok, err := op(key)
			if err != nil {
				b.Error(err)
				return
			}
			if !ok {
				b.Errorf("key %q: denied, but the limit admits everything", key)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func BenchmarkLimitTx(b *testing.B) {
	ctx := context.Background()
	pool := testdb.Pool(b, testdb.Schema(b), pgx.QueryExecModeCacheStatement, benchConns)
	_, err := pool.Exec(ctx, benchfloor.PGDDL)
	require.NoError(b, err)
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"unsharded": benchConfig(1),
		"shards16":  benchConfig(16),
	}, nil)
	require.NoError(b, err)

	floor := func(hot bool) func(b *testing.B) {
		return func(b *testing.B) {
			runParallel(b, func() *benchKeys { return newBenchKeys(b, hot) },
				func(key string) error {
					_, err := pool.Exec(ctx, benchfloor.PGInsert, key, benchCapacity, time.Now())
					return err
				},
				func(key string) (bool, error) { return pgFloor(ctx, pool, key) })
		}
	}
	limit := func(name string, hot bool) func(b *testing.B) {
		return func(b *testing.B) {
			runParallel(b, func() *benchKeys { return newBenchKeys(b, hot) }, nil,
				func(key string) (bool, error) {
					var res txlimit.Result
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
						res, err = l.LimitTx(ctx, tx, name, key)
						return err
					})
					return res.OK, err
				})
		}
	}
	// The same calls on database/sql (pgx's stdlib driver on the same
	// pool) through pgsqlstore.
	db := stdlib.OpenDBFromPool(pool)
	b.Cleanup(func() { _ = db.Close() })
	ls, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
		"unsharded": benchConfig(1),
		"shards16":  benchConfig(16),
	}, nil)
	require.NoError(b, err)
	limitSQL := func(name string, hot bool) func(b *testing.B) {
		return func(b *testing.B) {
			runParallel(b, func() *benchKeys { return newBenchKeys(b, hot) }, nil,
				func(key string) (bool, error) {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return false, err
					}
					res, err := ls.LimitTx(ctx, tx, name, key)
					if err != nil {
						_ = tx.Rollback()
						return false, err
					}
					return res.OK, tx.Commit()
				})
		}
	}
	b.Run("floor/distinct", floor(false))
	b.Run("txlimit/distinct", limit("unsharded", false))
	b.Run("pgsqlstore/distinct", limitSQL("unsharded", false))
	b.Run("floor/hot", floor(true))
	b.Run("txlimit/hot", limit("unsharded", true))
	b.Run("pgsqlstore/hot", limitSQL("unsharded", true))
	b.Run("txlimit/hot-shards16", limit("shards16", true))
	b.Run("pgsqlstore/hot-shards16", limitSQL("shards16", true))
}

// BenchmarkLimitTxSerial times one call after another on one connection,
// each in a transaction of its own (BEGIN; …; COMMIT), where nothing queues:
// the latency a call adds, where round trips show.
//
//	go test -run '^$' -bench 'LimitTxSerial' -benchtime 2000x .
//
// Each iteration runs every subject once, in turn, so that the load of a
// shared machine falls on all of them alike, and the benchmark reports each
// subject's median (µs) and the ratios of medians. The subjects: empty-tx
// (BEGIN; COMMIT, what every subject also pays); floor (the hand-written
// SELECT … FOR UPDATE, then UPDATE); locked (LimitTx on a limit whose Period,
// 290 years, is above 2^53 µs, which keeps it off the one-statement path:
// the locked path of the same build, two round trips like the floor); and
// txlimit (LimitTx, one statement).
func BenchmarkLimitTxSerial(b *testing.B) {
	ctx := context.Background()
	pool := testdb.Pool(b, testdb.Schema(b), pgx.QueryExecModeCacheStatement, 1)
	_, err := pool.Exec(ctx, benchfloor.PGDDL)
	require.NoError(b, err)
	// The pool's one connection does not wait for its commits to reach
	// the disk, whose flush would otherwise be most of every write
	// transaction's time and most of its variance.
	_, err = pool.Exec(ctx, "SET synchronous_commit = off")
	require.NoError(b, err)
	longPeriod := 290 * 365 * 24 * time.Hour
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"txlimit": benchConfig(1),
		"locked":  {Kind: txlimit.TokenBucket, Rate: 1, Period: longPeriod, Capacity: benchCapacity},
	}, nil)
	require.NoError(b, err)
	key := fmt.Sprintf("%s#%d", b.Name(), benchRun.Add(1))
	_, err = pool.Exec(ctx, benchfloor.PGInsert, key, benchCapacity, time.Now())
	require.NoError(b, err)
	limit := func(name string) func() (bool, error) {
		return func() (bool, error) {
			var res txlimit.Result
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
				res, err = l.LimitTx(ctx, tx, name, key)
				return err
			})
			return res.OK, err
		}
	}
	p50 := runSerial(b, []serialSubject{
		{name: "empty-tx", op: func() (bool, error) { return true, pgx.BeginFunc(ctx, pool, func(pgx.Tx) error { return nil }) }},
		{name: "floor", op: func() (bool, error) { return pgFloor(ctx, pool, key) }},
		{name: "locked", op: limit("locked")},
		{name: "txlimit", op: limit("txlimit")},
	})
	b.ReportMetric(p50["txlimit"]/p50["locked"], "txlimit/locked")
	b.ReportMetric(p50["txlimit"]/p50["floor"], "txlimit/floor")
	b.ReportMetric((p50["txlimit"]-p50["empty-tx"])/(p50["floor"]-p50["empty-tx"]), "step-txlimit/step-floor")
}

// serialSubject is one subject of a serial benchmark: op runs one call in a
// transaction of its own and says whether it was admitted; trips, when set,
// counts the round trips of op's connection.
type serialSubject struct {
	name  string
	op    func() (bool, error)
	trips *tripCounter
}

// runSerial runs every subject once per iteration, in turn, so that the
// load of a shared machine falls on all of them alike; it reports each
// subject's median (µs) and, where counted, its round trips per call, and
// returns the medians by name. A denial or an error fails the benchmark.
func runSerial(b *testing.B, subjects []serialSubject) map[string]float64 {
	times := make([][]time.Duration, len(subjects))
	wire := make([]int, len(subjects))
	for b.Loop() {
		for i, s := range subjects {
			if s.trips != nil {
				s.trips.take()
			}
			start := time.Now()
			ok, err := s.op()
			times[i] = append(times[i], time.Since(start))
			if s.trips != nil {
				wire[i] += s.trips.take().Wire
			}
			if err != nil || !ok {
				b.Fatalf("%s: ok %v, err %v", s.name, ok, err)
			}
		}
	}
	p50 := make(map[string]float64, len(subjects))
	for i, s := range subjects {
		slices.Sort(times[i])
		p50[s.name] = float64(times[i][len(times[i])/2].Microseconds())
		b.ReportMetric(p50[s.name], s.name+"-p50-µs")
		if s.trips != nil {
			b.ReportMetric(float64(wire[i])/float64(len(times[i])), s.name+"-trips")
		}
	}
	return p50
}

// BenchmarkSQLiteLimitTx compares LimitTx with the hand-written floor on a
// WAL file. SQLite has one writer at a time whatever the keys, so each
// goroutine uses a key of its own.
func BenchmarkSQLiteLimitTx(b *testing.B) {
	const conns = 8
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(b)+testdb.SQLiteDSN)
	require.NoError(b, err)
	b.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(conns)
	require.NoError(b, migrations.Up(ctx, db, migrations.SQLite))
	_, err = db.Exec(`CREATE TABLE floor_table (k TEXT PRIMARY KEY, value REAL NOT NULL, ts INTEGER NOT NULL) WITHOUT ROWID`)
	require.NoError(b, err)
	l, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{"unsharded": benchConfig(1)}, nil)
	require.NoError(b, err)

	setParallelism := func(b *testing.B) {
		b.SetParallelism((conns + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	}
	b.Run("floor", func(b *testing.B) {
		setParallelism(b)
		runParallel(b, func() *benchKeys { return newBenchKeys(b, false) },
			func(key string) error {
				_, err := db.ExecContext(ctx, `INSERT INTO floor_table (k, value, ts) VALUES (?, ?, ?) ON CONFLICT (k) DO NOTHING`,
					key, benchCapacity, time.Now().UnixMicro())
				return err
			},
			func(key string) (bool, error) {
				// BEGIN IMMEDIATE, from the DSN's _txlock=immediate.
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return false, err
				}
				defer func() { _ = tx.Rollback() }()
				var value float64
				var ts int64
				if err := tx.QueryRowContext(ctx, `SELECT value, ts FROM floor_table WHERE k = ?`, key).Scan(&value, &ts); err != nil {
					return false, err
				}
				now := time.Now()
				next, ok := floorTake(value, time.UnixMicro(ts), now)
				if !ok {
					return false, nil
				}
				if _, err := tx.ExecContext(ctx, `UPDATE floor_table SET value = ?, ts = ? WHERE k = ?`, next, now.UnixMicro(), key); err != nil {
					return false, err
				}
				return true, tx.Commit()
			})
	})
	b.Run("txlimit", func(b *testing.B) {
		setParallelism(b)
		runParallel(b, func() *benchKeys { return newBenchKeys(b, false) }, nil,
			func(key string) (bool, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return false, err
				}
				defer func() { _ = tx.Rollback() }()
				res, err := l.LimitTx(ctx, tx, "unsharded", key)
				if err != nil {
					return false, err
				}
				return res.OK, tx.Commit()
			})
	})
}

// trips counts what one pgx connection sends: queries and batches as pgx's
// tracer sees them, and, on the wire, the ReadyForQuery messages the server
// returns, one per round trip (every simple query, and every extended-protocol
// Sync, ends with one).
type trips struct {
	Queries      int // Query, QueryRow and Exec calls
	Batches      int // SendBatch calls
	BatchQueries int // statements inside those batches
	Prepares     int // explicit Prepare calls
	Wire         int // round trips the server answered
}

type tripCounter struct {
	mu   sync.Mutex
	got  trips
	wire testdb.ReadyCounter
}

func (c *tripCounter) add(f func(t *trips)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.got)
}

func (c *tripCounter) take() trips {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.got
	c.got = trips{}
	t.Wire = c.wire.Take()
	return t
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.add(func(t *trips) { t.Queries++ })
	return ctx
}

func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.add(func(t *trips) { t.Batches++ })
	return ctx
}

func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.add(func(t *trips) { t.BatchQueries++ })
}

func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *tripCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.add(func(t *trips) { t.Prepares++ })
	return ctx
}

func (c *tripCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// countedConfig is a connection config on schema whose round trips counter
// sees on the wire (counter.take().Wire). The count parses the server's
// messages, so they must not be encrypted.
func countedConfig(tb testing.TB, schema string, counter *tripCounter) *pgx.ConnConfig {
	tb.Helper()
	cfg, err := pgx.ParseConfig(testdb.URL(tb))
	require.NoError(tb, err)
	cfg.RuntimeParams["search_path"] = schema
	cfg.TLSConfig = nil
	cfg.Fallbacks = nil
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return counter.wire.Conn(conn), nil
	}
	return cfg
}

// TestRoundTrips pins how many round trips LimitTx costs inside the caller's
// transaction (BEGIN and COMMIT are the caller's and not counted), once the
// rows exist and the connection has its statements cached.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	counter := &tripCounter{}
	cfg := countedConfig(t, schema, counter)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	cfg.Tracer = counter
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	clk := storetest.NewClock()
	cfgs := map[string]txlimit.Config{
		"unsharded": benchConfig(1),
		"sharded":   benchConfig(16),
		// Tight limits on the frozen clock, to steer calls onto the
		// fallback and denial paths.
		"tight":         {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
		"tight-sharded": {Kind: txlimit.TokenBucket, Rate: 4, Period: time.Hour, Shards: 4},
	}
	live, err := txlimit.New(pgstore.New(nil), cfgs, nil)
	require.NoError(t, err)
	frozen, err := txlimit.New(pgstore.New(nil), cfgs, &txlimit.Options{Clock: clk.Now})
	require.NoError(t, err)

	// limitTx runs one LimitTx in a transaction of its own and returns
	// its result and what it sent.
	limitTx := func(l *txlimit.Limiter[pgx.Tx], name, key string, opts ...txlimit.Option) (txlimit.Result, trips) {
		t.Helper()
		var res txlimit.Result
		var got trips
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
			counter.take()
			res, err = l.LimitTx(ctx, tx, name, key, opts...)
			got = counter.take()
			return err
		}))
		return res, got
	}
	// Every query and batch is one round trip once the connection has its
	// statements cached: the tracer's count and the wire's agree.
	requireTrips := func(t *testing.T, want trips, got trips, msg string) {
		t.Helper()
		t.Logf("%s: %d queries, %d batches (%d statements), %d round trips", msg, got.Queries, got.Batches, got.BatchQueries, got.Wire)
		require.Equal(t, got.Queries+got.Batches, got.Wire, "%s: one round trip per query or batch", msg)
		require.Zero(t, got.Prepares, msg)
		require.Equal(t, want.Queries, got.Queries, "%s: queries", msg)
		require.Equal(t, want.Batches, got.Batches, "%s: batches", msg)
	}

	t.Run("Unsharded", func(t *testing.T) {
		// The first call on a connection prepares its statements; the
		// first of a key creates its row.
		limitTx(live, "unsharded", "warm")
		limitTx(live, "unsharded", "k")
		for i := range 5 {
			res, got := limitTx(live, "unsharded", "k")
			require.True(t, res.OK)
			// One statement: INSERT … ON CONFLICT DO UPDATE … RETURNING,
			// which refills, decides and writes.
			requireTrips(t, trips{Queries: 1}, got, fmt.Sprintf("steady state, call %d", i))
		}
	})

	t.Run("UnshardedDenied", func(t *testing.T) {
		// The first denial on the connection prepares the read it adds.
		for _, key := range []string{"rehearsal", "k"} {
			res, _ := limitTx(frozen, "tight", key)
			require.True(t, res.OK)
			res, got := limitTx(frozen, "tight", key)
			require.False(t, res.OK)
			if key == "k" {
				// The statement grants nothing and leaves the row locked;
				// SELECT … FOR UPDATE reads it for algo, which denies; a
				// denial writes nothing.
				requireTrips(t, trips{Queries: 2}, got, "denied")
			}
		}
	})

	t.Run("ShardedFastPath", func(t *testing.T) {
		// The first call of a key finds no row to try and creates them all
		// on the fallback path; the second call of "warm" prepares the
		// fast path's write.
		limitTx(live, "sharded", "warm")
		limitTx(live, "sharded", "warm")
		limitTx(live, "sharded", "k")
		for i := range 5 {
			res, got := limitTx(live, "sharded", "k")
			require.True(t, res.OK)
			// [SAVEPOINT; SELECT … SKIP LOCKED …], then [UPDATE; RELEASE].
			requireTrips(t, trips{Batches: 2}, got, fmt.Sprintf("steady state, call %d", i))
		}
	})

	t.Run("ShardedAllBusy", func(t *testing.T) {
		// Another transaction holds every shard: the fast path finds none
		// free and waits for one, the random shard it started from, instead
		// of locking them all; it gets it when the holder commits.
		limitTx(live, "sharded", "busy-rehearsal")
		limitTx(live, "sharded", "busy")
		holder, err := pgx.Connect(ctx, testdb.URL(t))
		require.NoError(t, err)
		defer holder.Close(ctx)
		_, err = holder.Exec(ctx, "SET search_path = "+pgx.Identifier{schema}.Sanitize())
		require.NoError(t, err)
		tx, err := holder.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		rows, err := tx.Query(ctx, `SELECT shard FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard FOR UPDATE`, "sharded", "busy")
		require.NoError(t, err)
		held, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		require.Len(t, held, 16)

		type outcome struct {
			res txlimit.Result
			got trips
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			_ = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
				counter.take()
				o.res, err = live.LimitTx(ctx, tx, "sharded", "busy")
				o.got = counter.take()
				return err
			})
			done <- o
		}()
		// Commit once the call waits for a row lock held by the holder.
		var holderPID uint32 = holder.PgConn().PID()
		require.Eventually(t, func() bool {
			var waiting bool
			err := holder.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE $1 = ANY(pg_blocking_pids(pid)))`, holderPID).Scan(&waiting)
			return err == nil && waiting
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, tx.Commit(ctx))
		o := <-done
		require.True(t, o.res.OK)
		// [SAVEPOINT; SELECT … SKIP LOCKED] finds nothing, SELECT … FOR
		// UPDATE of one shard waits, then [UPDATE; RELEASE].
		requireTrips(t, trips{Queries: 1, Batches: 2}, o.got, "every shard busy")
	})

	t.Run("ShardedFallback", func(t *testing.T) {
		// The sequence runs twice, on two keys, and is counted the second
		// time: a statement that only these paths use is prepared on its
		// first use, which costs a round trip of its own.
		sequence := func(key string, count bool) {
			// 4 shards of 1 token each; the first call creates them and
			// leaves 3 tokens, 0.75 a shard. A count of 2 exceeds one
			// shard, so it goes straight to the fallback: the unlocked
			// pre-read, the lock of every shard, the write (which spreads
			// the 1 token left, 0.25 a shard).
			res, _ := limitTx(frozen, "tight-sharded", key)
			require.True(t, res.OK)
			res, got := limitTx(frozen, "tight-sharded", key, txlimit.Count(2))
			require.True(t, res.OK)
			if count {
				requireTrips(t, trips{Queries: 3}, got, "count above one shard's capacity")
			}

			// Each shard holds less than 1: the fast path takes a shard,
			// finds it short and rolls back to its savepoint, then the
			// fallback pools the shards (after the pre-read, unless it
			// reuses what the fast path's first batch read) and grants.
			res, got = limitTx(frozen, "tight-sharded", key)
			require.True(t, res.OK)
			if count {
				t.Logf("shard short, pool enough: %+v", got)
				require.Equal(t, 2, got.Batches, "the fast path's try and undo")
				require.Equal(t, got.Queries+got.Batches, got.Wire)
				require.LessOrEqual(t, got.Wire, 5, "try, undo, pre-read, lock every shard, write")
				require.GreaterOrEqual(t, got.Wire, 4, "try, undo, lock every shard, write")
			}

			// Nothing is left: the fast path finds its shard short, and
			// the unlocked pre-read denies without locking every shard.
			res, got = limitTx(frozen, "tight-sharded", key)
			require.False(t, res.OK)
			if count {
				t.Logf("denied at saturation: %+v", got)
				require.Equal(t, 2, got.Batches, "the fast path's try and undo")
				require.Equal(t, got.Queries+got.Batches, got.Wire)
				require.LessOrEqual(t, got.Queries, 1, "at most the pre-read; no lock of every shard, no write")
			}
		}
		sequence("rehearsal", false)
		sequence("k", true)
	})
}
