// Command pgcommitexp measures where a business transaction's CPU goes
// when its take rides the COMMIT (Limiter.Commit), against the same
// transaction with no limit and with redis_rate beside it, and what the
// take statement itself costs against hand-written ones. Each subject is
// the business transaction BEGIN; INSERT of an order; <step>; COMMIT, on
// distinct keys (one a client):
//
//	none        no step (pgx.BeginFunc)
//	pipe        no step, the COMMIT sent as a batch (the pipelines' baseline)
//	select1     SELECT 1 in one batch with the COMMIT
//	update      a minimal one-row UPDATE … RETURNING with the COMMIT
//	upsert      a minimal INSERT … ON CONFLICT DO UPDATE … RETURNING with the COMMIT
//	take        txlimit's TakeBucket as a take at commit sends it, by hand
//	take-plain  the same without the denial's function (txlimit_deny)
//	commit      Limiter.Commit on pgstore
//	limittx     LimitTx inside pgx.BeginFunc
//	redis_rate  github.com/go-redis/redis_rate/v10 beside pgx.BeginFunc
//
// By default it runs every subject for -d with -clients connections, round
// after round (interleaved), and prints transactions/s and CPU a
// transaction: the PostgreSQL server's (every process named postgres, from
// /proc), its own, and Redis's. With -cg it counts instead the
// instructions the server's backend executes a transaction, on a server
// run under callgrind (scripts/callgrind.sh): 300 transactions on one
// connection less 100 on another, over 200. It works in the schema
// pgcommitexp, which it drops and creates.
//
//	go run . -clients 32 -d 6s -rounds 3
//	go run . -cg /tmp/txlimit-callgrind -dsn 'postgres://postgres@127.0.0.1:7501/postgres?sslmode=disable'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/pgdb"
	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
	"github.com/txlimit/txlimit/internal/testkit/measure"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

const (
	schema = "pgcommitexp"
	rows   = `CREATE TABLE exp_row (k text PRIMARY KEY, v float8 NOT NULL, ts timestamptz NOT NULL) WITH (fillfactor = 90)`
	// A token bucket of capacity $2 refilling $3 a second, with none of
	// txlimit's care (no clock stepping back, no tolerance, no shards).
	update = `UPDATE exp_row AS f
		SET v = least(f.v + extract(epoch FROM statement_timestamp() - f.ts) * $3::float8, $2::float8) - 1, ts = statement_timestamp()
		WHERE k = $1 AND least(f.v + extract(epoch FROM statement_timestamp() - f.ts) * $3::float8, $2::float8) >= 1 RETURNING v`
	upsert = `INSERT INTO exp_row AS f (k, v, ts) VALUES ($1, $2::float8 - 1, statement_timestamp())
		ON CONFLICT (k) DO UPDATE
		SET v = least(f.v + extract(epoch FROM statement_timestamp() - f.ts) * $3::float8, $2::float8) - 1, ts = statement_timestamp()
		WHERE least(f.v + extract(epoch FROM statement_timestamp() - f.ts) * $3::float8, $2::float8) >= 1 RETURNING v`
	capacity = 1e12
)

func main() {
	var (
		dsn      = flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL")
		redisURL = flag.String("redis", "127.0.0.1:6379", "Redis, for redis_rate")
		clients  = flag.Int("clients", 32, "connections, one key each")
		dur      = flag.Duration("d", 5*time.Second, "how long each subject runs a round")
		rounds   = flag.Int("rounds", 3, "rounds")
		only     = flag.String("s", "none,pipe,select1,update,upsert,take,take-plain,commit,limittx,redis_rate", "subjects, comma-separated")
		cg       = flag.String("cg", "", "callgrind's output directory: count the server's instructions a transaction")
	)
	flag.Parse()
	if err := run(*dsn, *redisURL, *clients, *dur, *rounds, strings.Split(*only, ","), *cg); err != nil {
		fmt.Fprintln(os.Stderr, "pgcommitexp:", err)
		os.Exit(1)
	}
}

func run(dsn, redisAddr string, clients int, dur time.Duration, rounds int, subjects []string, cg string) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer func() { _, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if err := setUp(ctx, cfg, clients); err != nil {
		return err
	}
	cfg.MaxConns = int32(clients)
	if cg != "" {
		// One backend a count: the pool is closed between counts.
		cfg.MaxConns = 1
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	steps, err := newSteps(ctx, pool, redisAddr, clients)
	if err != nil {
		return err
	}
	for _, s := range subjects {
		if steps[s] == nil {
			return fmt.Errorf("-s: unknown subject %q", s)
		}
	}
	if cg != "" {
		return countInstructions(ctx, pool, steps, subjects, cg)
	}
	fmt.Printf("%-11s %8s %10s %10s %10s   (µs of CPU a transaction)\n", "subject", "tx/s", "postgres", "this", "redis")
	for range rounds {
		for _, s := range subjects {
			if err := runSubject(s, steps[s], clients, dur); err != nil {
				return err
			}
		}
	}
	return nil
}

// setUp migrates the schema and creates the business and hand-written
// tables, on a pool of its own that it closes. The hand-written row of
// every key exists before the first transaction, so that update, which
// cannot create it, updates a row from its first call.
func setUp(ctx context.Context, cfg *pgxpool.Config, clients int) error {
	pool, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		return err
	}
	if _, err = pool.Exec(ctx, benchfloor.PGBusinessDDL+"; "+rows); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `INSERT INTO exp_row (k, v, ts)
		SELECT k, $2, statement_timestamp() FROM unnest($1::text[]) AS k`, keys(clients), float64(capacity))
	return err
}

// keys are the keys of the subjects: k for the instruction counts, k0… for
// the clients of the timed runs.
func keys(clients int) []string {
	out := []string{"k"}
	for c := range clients {
		out = append(out, fmt.Sprint("k", c))
	}
	return out
}

type step func(ctx context.Context, key string) error

func newSteps(ctx context.Context, pool *pgxpool.Pool, redisAddr string, clients int) (map[string]step, error) {
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"exp": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: capacity}}, nil)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: clients})
	rl := redis_rate.NewLimiter(rdb)
	rlimit := redis_rate.Limit{Rate: 1, Burst: capacity, Period: time.Hour}
	work := func(ctx context.Context, key string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := tx.Exec(ctx, benchfloor.PGBusinessInsert, key, 1); return err }
	}
	// pipe: the business transaction with queue's statements and the
	// COMMIT in one batch, on a connection acquired for it, as Commit
	// does.
	pipe := func(queue func(b *pgx.Batch, key string)) step {
		return func(ctx context.Context, key string) error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release() // destroyed when left in a transaction
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			if err := work(ctx, key)(tx); err != nil {
				return err
			}
			b := &pgx.Batch{}
			queue(b, key)
			b.Queue("COMMIT")
			return tx.SendBatch(ctx, b).Close()
		}
	}
	// take: TakeBucket queued by its generated method, so that its
	// arguments follow the statement; with must, as a take at commit
	// sends it (internal/pgproto).
	take := func(must bool) step {
		return pipe(func(b *pgx.Batch, key string) {
			cfg := algo.Config{Kind: algo.TokenBucket, Rate: 1, Period: time.Hour.Microseconds(), Capacity: capacity}
			_, _ = pgdb.New().TakeBucket(ctx, queuer{b, must}, takeParams(cfg, key))
		})
	}
	return map[string]step{
		"none":       func(ctx context.Context, key string) error { return pgx.BeginFunc(ctx, pool, work(ctx, key)) },
		"pipe":       pipe(func(*pgx.Batch, string) {}),
		"select1":    pipe(func(b *pgx.Batch, _ string) { b.Queue("SELECT 1") }),
		"update":     pipe(func(b *pgx.Batch, key string) { b.Queue(update, key, capacity, 1.0/3600) }),
		"upsert":     pipe(func(b *pgx.Batch, key string) { b.Queue(upsert, key, capacity, 1.0/3600) }),
		"take":       take(true),
		"take-plain": take(false),
		"commit": func(ctx context.Context, key string) error {
			_, err := l.Commit(ctx, work(ctx, key), txlimit.Request{Name: "exp", Key: key})
			return err
		},
		"limittx": func(ctx context.Context, key string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := work(ctx, key)(tx); err != nil {
					return err
				}
				_, err := l.LimitTx(ctx, tx, "exp", key)
				return err
			})
		},
		"redis_rate": func(ctx context.Context, key string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := work(ctx, key)(tx); err != nil {
					return err
				}
				res, err := rl.Allow(ctx, "pgcommitexp:"+key, rlimit)
				if err == nil && res.Allowed == 0 {
					err = errors.New("redis_rate denied")
				}
				return err
			})
		},
	}, nil
}

// takeParams are TakeBucket's arguments for one token of key, which always
// has tokens (capacity), as internal/pgproto computes them.
func takeParams(cfg algo.Config, key string) pgdb.TakeBucketParams {
	return pgdb.TakeBucketParams{Name: "exp-hand", Key: key, FreshValue: cfg.Capacity - 1,
		FullTs: time.UnixMicro(0), Rate: cfg.Rate, Period: float64(cfg.Period), Capacity: cfg.Capacity, Count: 1}
}

// queuer is a pgdb.DBTX that queues the statement a generated method sends
// into a batch instead of sending it, with must as a take at commit sends
// it: each /*must*/ replaced by OR txlimit_deny().
type queuer struct {
	b    *pgx.Batch
	must bool
}

func (q queuer) sql(sql string) string {
	if q.must {
		return strings.ReplaceAll(sql, "/*must*/", "OR txlimit_deny()")
	}
	return sql
}

func (q queuer) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(q.sql(sql), args...)
	return pgconn.CommandTag{}, nil
}

func (q queuer) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.b.Queue(q.sql(sql), args...)
	return nil, errQueued
}

func (q queuer) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.b.Queue(q.sql(sql), args...)
	return queuedRow{}
}

var errQueued = errors.New("queued")

type queuedRow struct{}

func (queuedRow) Scan(...any) error { return errQueued }

// runSubject runs s for dur on clients goroutines, each on its own key, after
// one transaction each to warm up, and prints its row.
func runSubject(name string, s step, clients int, dur time.Duration) error {
	ctx := context.Background()
	for c := range clients {
		if err := s(ctx, fmt.Sprint("k", c)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	var n atomic.Int64
	var failed atomic.Pointer[error]
	stop := make(chan struct{})
	pg0, redis0, self0 := measure.CommandTicks("postgres"), measure.CommandTicks("redis-server"), selfCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			key := fmt.Sprint("k", c)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := s(ctx, key); err != nil {
					failed.Store(&err)
					return
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	if err := failed.Load(); err != nil {
		return fmt.Errorf("%s: %w", name, *err)
	}
	elapsed, tx := time.Since(start), float64(n.Load())
	perTx := func(t int64) float64 { return float64(t) * 1e6 / measure.ClockTicks / tx }
	fmt.Printf("%-11s %8.0f %10.1f %10.1f %10.1f\n", name, tx/elapsed.Seconds(),
		perTx(measure.CommandTicks("postgres")-pg0), float64((selfCPU()-self0).Microseconds())/tx, perTx(measure.CommandTicks("redis-server")-redis0))
	return nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countInstructions prints, for each subject, the instructions the
// server's backend executed a transaction: 300 transactions on one
// connection less 100 on another, over 200, so that the connection's own
// start and end cancel out.
func countInstructions(ctx context.Context, pool *pgxpool.Pool, steps map[string]step, subjects []string, dir string) error {
	count := func(s step, n int) (int64, error) {
		pool.Reset() // a new backend
		var pid int32
		if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return 0, err
		}
		for range n {
			if err := s(ctx, "k"); err != nil {
				return 0, err
			}
		}
		pool.Reset() // the backend exits, and callgrind writes its file
		return measure.CallgrindTotal(filepath.Join(dir, fmt.Sprintf("cg.%d", pid)))
	}
	for _, name := range subjects {
		few, err := count(steps[name], 100)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		many, err := count(steps[name], 300)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("%-11s %8.1f k instructions a transaction\n", name, float64(many-few)/200/1000)
	}
	return nil
}
