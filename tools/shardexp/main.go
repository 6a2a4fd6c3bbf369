// Command shardexp runs the experiments behind "Why 16 shards at 32 clients
// stay near half of distinct keys" in docs/sharding.md: ways of taking one
// token from a hot limit spread over N rows, written by hand in SQL, beside
// txlimit's LimitTx and the distinct-key floor, each client a goroutine with
// a connection of its own, every call BEGIN … COMMIT. It is a research tool,
// not the benchmark (that is cmd/txlimit-bench): the variants admit
// everything (capacity 1e9) and nothing checks their counts.
//
//	cd tools/shardexp && go run . -dsn postgres://postgres@127.0.0.1:5432/test?sslmode=disable -c 32 -n 16 -r 5
//
// For each variant it prints ops/s, the share of a call during which the
// row is held (from the return of the statement that locked it to the return
// of COMMIT, as the client sees it; hand-written variants only) and the
// client's CPU time per call; then the medians over the interleaved runs and
// their ratios to txlimit and to the floor on distinct keys.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

const (
	// The first free row going up from $1, then from 0: txlimit's lock.
	lockFrom = `WITH a AS MATERIALIZED (SELECT shard, value, ts FROM txlimit WHERE name = 'h' AND key = '' AND shard >= $1 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED),
b AS MATERIALIZED (SELECT shard, value, ts FROM txlimit WHERE name = 'h' AND key = '' AND shard < $1 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED)
SELECT shard, value, ts FROM a UNION ALL SELECT shard, value, ts FROM b LIMIT 1`
	// The first free row of a random permutation, reading and sorting
	// every row: txlimit's lock before it was changed.
	lockSorted = `SELECT shard, value, ts FROM txlimit WHERE name = 'h' AND key = '' AND shard = ANY($1)
ORDER BY array_position($1, shard) LIMIT 1 FOR UPDATE SKIP LOCKED`
	lockOne     = `SELECT shard, value, ts FROM txlimit WHERE name = 'h' AND key = '' AND shard = $1 FOR UPDATE`
	writeOne    = `UPDATE txlimit SET value = $2, ts = $3 WHERE name = 'h' AND key = '' AND shard = $1`
	refill      = `LEAST(value + GREATEST(EXTRACT(EPOCH FROM (clock_timestamp() - ts)), 0) * $2::float8, $3::float8) - 1`
	lockAndTake = `WITH a AS MATERIALIZED (SELECT shard FROM txlimit WHERE name = 'h' AND key = '' AND shard >= $1 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED),
b AS MATERIALIZED (SELECT shard FROM txlimit WHERE name = 'h' AND key = '' AND shard < $1 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED),
c AS (SELECT shard FROM a UNION ALL SELECT shard FROM b LIMIT 1)
UPDATE txlimit AS t SET value = ` + refill + `, ts = clock_timestamp() FROM c
WHERE t.name = 'h' AND t.key = '' AND t.shard = c.shard RETURNING t.shard`
	waitAndTake = `UPDATE txlimit SET value = ` + refill + `, ts = clock_timestamp() WHERE name = 'h' AND key = '' AND shard = $1`
)

// call is one variant's work inside the transaction. It stores the instant
// it holds its row in *locked (hand-written variants).
type call func(ctx context.Context, tx pgx.Tx, client int, locked *time.Time) error

type variant struct {
	name string
	run  call
}

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection string")
	clients := flag.Int("c", 32, "clients")
	shards := flag.Int("n", 16, "shards")
	dur := flag.Duration("d", 3*time.Second, "length of each run")
	reps := flag.Int("r", 3, "interleaved runs of each variant")
	only := flag.String("only", "", "comma-separated variants to run (default all)")
	flag.Parse()
	if err := run(*dsn, *clients, *shards, *dur, *reps, *only); err != nil {
		fmt.Fprintln(os.Stderr, "shardexp:", err)
		os.Exit(1)
	}
}

func run(dsn string, clients, n int, dur time.Duration, reps int, only string) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	schema := fmt.Sprintf("shardexp_%d", rand.IntN(1e9))
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns, cfg.MinConns = int32(clients+1), int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool), migrations.Postgres); err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE TABLE floor_table (k text PRIMARY KEY, value double precision NOT NULL, ts timestamptz NOT NULL)`,
		`INSERT INTO floor_table SELECT 'k' || i, 1e9, now() FROM generate_series(0, ` + fmt.Sprint(clients-1) + `) AS i`,
		`INSERT INTO txlimit (name, key, shard, value, ts) SELECT 'h', '', s, 1e9, now() FROM generate_series(0, ` + fmt.Sprint(n-1) + `) AS s`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	lim, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"distinct": {Kind: txlimit.TokenBucket, Rate: 1e9, Period: time.Second},
		"sharded":  {Kind: txlimit.TokenBucket, Rate: 1e9, Period: time.Second, Shards: n},
	}, nil)
	if err != nil {
		return err
	}
	perShard := 1e9 / float64(n)

	// takeSQL takes a token from the row lock returned, in Go, like the
	// bench's floor: UPDATE with the new value.
	takeSQL := func(ctx context.Context, tx pgx.Tx, row pgx.Row, wait int32, locked *time.Time) error {
		var s int32
		var v float64
		var ts time.Time
		err := row.Scan(&s, &v, &ts)
		if errors.Is(err, pgx.ErrNoRows) {
			s = wait
			err = tx.QueryRow(ctx, lockOne, s).Scan(&s, &v, &ts)
		}
		if err != nil {
			return err
		}
		*locked = time.Now()
		_, err = tx.Exec(ctx, writeOne, s, v-1, time.Now())
		return err
	}
	variants := []variant{
		{"floor-distinct", func(ctx context.Context, tx pgx.Tx, c int, locked *time.Time) error {
			k := fmt.Sprint("k", c)
			var v float64
			var ts time.Time
			if err := tx.QueryRow(ctx, `SELECT value, ts FROM floor_table WHERE k = $1 FOR UPDATE`, k).Scan(&v, &ts); err != nil {
				return err
			}
			*locked = time.Now()
			_, err := tx.Exec(ctx, `UPDATE floor_table SET value = $2, ts = $3 WHERE k = $1`, k, v-1, time.Now())
			return err
		}},
		{"txlimit-distinct", func(ctx context.Context, tx pgx.Tx, c int, _ *time.Time) error {
			_, err := lim.LimitTx(ctx, tx, "distinct", fmt.Sprint("k", c))
			return err
		}},
		{"txlimit-shards", func(ctx context.Context, tx pgx.Tx, _ int, _ *time.Time) error {
			_, err := lim.LimitTx(ctx, tx, "sharded", "")
			return err
		}},
		// The bench's sharded floor: the first free row from a random one,
		// else wait for that one; arithmetic in Go.
		{"sql-shards", func(ctx context.Context, tx pgx.Tx, _ int, locked *time.Time) error {
			start := int32(rand.IntN(n))
			return takeSQL(ctx, tx, tx.QueryRow(ctx, lockFrom, start), start, locked)
		}},
		// The same inside a savepoint, sent as txlimit sends it:
		// [SAVEPOINT; lock], then [UPDATE; RELEASE].
		{"sql-shards-savepoint", func(ctx context.Context, tx pgx.Tx, _ int, locked *time.Time) error {
			start := int32(rand.IntN(n))
			s, v := start, 0.0
			var ts time.Time
			found := false
			b := &pgx.Batch{}
			b.Queue("SAVEPOINT t")
			b.Queue(lockFrom, start).QueryRow(func(row pgx.Row) error {
				err := row.Scan(&s, &v, &ts)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				found = err == nil
				return err
			})
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			if !found {
				if err := tx.QueryRow(ctx, lockOne, start).Scan(&s, &v, &ts); err != nil {
					return err
				}
			}
			*locked = time.Now()
			b = &pgx.Batch{}
			b.Queue(writeOne, s, v-1, time.Now())
			b.Queue("RELEASE SAVEPOINT t")
			return tx.SendBatch(ctx, b).Close()
		}},
		// The lock of every row sorted by a random permutation.
		{"sql-shards-sorted", func(ctx context.Context, tx pgx.Tx, _ int, locked *time.Time) error {
			order := make([]int32, n)
			for i, s := range rand.Perm(n) {
				order[i] = int32(s)
			}
			return takeSQL(ctx, tx, tx.QueryRow(ctx, lockSorted, order), order[0], locked)
		}},
		// Lock and write in one statement, the token arithmetic in SQL: the
		// row is held from that statement to COMMIT only.
		{"sql-shards-one-statement", func(ctx context.Context, tx pgx.Tx, _ int, locked *time.Time) error {
			start := int32(rand.IntN(n))
			var s int32
			err := tx.QueryRow(ctx, lockAndTake, start, perShard, perShard).Scan(&s)
			if errors.Is(err, pgx.ErrNoRows) {
				_, err = tx.Exec(ctx, waitAndTake, start, perShard, perShard)
			}
			*locked = time.Now()
			return err
		}},
		// Each client pinned to one row (two clients a row at 32 over 16),
		// waiting for it: what no library can do for its callers.
		{"sql-pinned", func(ctx context.Context, tx pgx.Tx, c int, locked *time.Time) error {
			s := int32(c % n)
			return takeSQL(ctx, tx, tx.QueryRow(ctx, lockOne, s), s, locked)
		}},
		// A random row, waiting for it.
		{"sql-random", func(ctx context.Context, tx pgx.Tx, _ int, locked *time.Time) error {
			s := int32(rand.IntN(n))
			return takeSQL(ctx, tx, tx.QueryRow(ctx, lockOne, s), s, locked)
		}},
	}

	runs := map[string][]float64{}
	for r := range reps {
		for _, v := range variants {
			if only != "" && !slices.Contains(strings.Split(only, ","), v.name) {
				continue
			}
			ops, hold, cpu, err := measure(ctx, pool, clients, dur, v.run)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			runs[v.name] = append(runs[v.name], ops)
			holdText := ""
			if hold > 0 {
				holdText = fmt.Sprintf("  row held %.2f of a call", hold)
			}
			fmt.Printf("run %d  %-26s %7.0f ops/s  client CPU %4.0f µs/call%s\n", r+1, v.name, ops, cpu, holdText)
		}
	}
	med := map[string]float64{}
	for name, xs := range runs {
		slices.Sort(xs)
		med[name] = xs[len(xs)/2]
	}
	fmt.Printf("\nmedians, %d clients, %d shards:\n", clients, n)
	for _, v := range variants {
		if m, ok := med[v.name]; ok {
			fmt.Printf("  %-26s %7.0f ops/s  %s  %s\n", v.name, m,
				ratioTo(m, med["txlimit-distinct"], "txlimit-distinct"), ratioTo(m, med["floor-distinct"], "floor-distinct"))
		}
	}
	return nil
}

func ratioTo(v, base float64, name string) string {
	if base == 0 {
		return ""
	}
	return fmt.Sprintf("%.2fx %s", v/base, name)
}

// measure runs clients goroutines, each on a connection of its own, calling
// BEGIN; c; COMMIT for d, and returns the calls per second, the share of a
// call's time its row was held (0 when c does not say), and the client
// process's CPU time per call in µs.
func measure(ctx context.Context, pool *pgxpool.Pool, clients int, d time.Duration, c call) (opsPerSec, held, cpuPerCall float64, err error) {
	var ops, heldNs, callNs atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	cpu0 := processCPU()
	start := time.Now()
	deadline := start.Add(d)
	for client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				once.Do(func() { firstErr = err })
				return
			}
			defer conn.Release()
			for time.Now().Before(deadline) {
				var locked time.Time
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return c(ctx, tx, client, &locked) })
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				ops.Add(1)
				if !locked.IsZero() {
					end := time.Now()
					heldNs.Add(int64(end.Sub(locked)))
					callNs.Add(int64(end.Sub(t0)))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, 0, 0, firstErr
	}
	n := max(ops.Load(), 1)
	if callNs.Load() > 0 {
		held = float64(heldNs.Load()) / float64(callNs.Load())
	}
	return float64(ops.Load()) / elapsed.Seconds(), held, float64(processCPU()-cpu0) / 1e3 / float64(n), nil
}

// processCPU is the user and system CPU time of this process, in ns.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
