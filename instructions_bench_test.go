package txlimit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
	"github.com/txlimit/txlimit/internal/testkit/measure"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// BenchmarkServerInstructions counts the instructions the PostgreSQL server
// executes for one transaction of each subject, on a server run under
// valgrind's callgrind (scripts/callgrind.sh, whose comment gives the
// command). Counts do not move with the machine's load, where timings on a
// shared 2-core machine do, and at 32 clients, where the server's CPU is the
// limit, throughput follows them. Each subject runs n transactions on a
// connection of its own, then 3n on another; the difference over 2n is the
// cost of one, without the connection's start and end.
//
// Subjects: empty-tx (BEGIN; COMMIT), floor (the hand-written SELECT … FOR
// UPDATE, then UPDATE), and LimitTx on a token bucket, a fixed window, a
// reservation, the locked Go path (a Period above 2^53 µs keeps a limit off
// the one-statement path), a limit over 4 shards, and commit, the token
// bucket taken at commit (Commit: BEGIN; the take and COMMIT in one
// pipeline).
func BenchmarkServerInstructions(b *testing.B) {
	dir := os.Getenv("TXLIMIT_CALLGRIND")
	if dir == "" {
		b.Skip("TXLIMIT_CALLGRIND is not set: start a server under callgrind with scripts/callgrind.sh, which gives the command")
	}
	ctx := context.Background()
	schema := testdb.Schema(b)
	setup := testdb.Pool(b, schema, pgx.QueryExecModeCacheStatement, 1)
	if _, err := setup.Exec(ctx, benchfloor.PGDDL); err != nil {
		b.Fatal(err)
	}
	if _, err := setup.Exec(ctx, benchfloor.PGInsert, "k", benchCapacity, time.Now()); err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	configs := map[string]txlimit.Config{
		"bucket":  benchConfig(1),
		"window":  {Kind: txlimit.FixedWindow, Rate: benchCapacity, Period: time.Hour, Capacity: benchCapacity},
		"reserve": benchConfig(1),
		"locked":  {Kind: txlimit.TokenBucket, Rate: 1, Period: 290 * 365 * 24 * time.Hour, Capacity: benchCapacity},
		"sharded": benchConfig(4),
	}
	// limit is one LimitTx of name in a transaction of its own.
	limit := func(pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], name string) func() (bool, error) {
		var opts []txlimit.Option
		if name == "reserve" {
			opts = append(opts, txlimit.Reserve())
		}
		return func() (ok bool, err error) {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				res, err := l.LimitTx(ctx, tx, name, "k", opts...)
				ok = res.OK
				return err
			})
			return ok, err
		}
	}
	subjects := []string{"empty-tx", "floor", "bucket", "window", "reserve", "locked", "sharded", "commit"}
	if only := os.Getenv("TXLIMIT_CALLGRIND_SUBJECTS"); only != "" {
		// A comma-separated list, to count some subjects only (each takes
		// about ten seconds under callgrind).
		subjects = strings.Split(only, ",")
	}
	backend := func(pool *pgxpool.Pool) int32 {
		var pid int32
		if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			b.Fatal(err)
		}
		return pid
	}
	// cost runs n transactions of subject s on a new connection and returns
	// what its backend executed, once it has exited and callgrind has
	// written its file.
	cost := func(s string, n int) int64 {
		pool := testdb.Pool(b, schema, pgx.QueryExecModeCacheStatement, 1)
		defer pool.Close()
		pid := backend(pool)
		l, err := txlimit.New(pgstore.New(pool), configs, nil)
		if err != nil {
			b.Fatal(err)
		}
		var op func() (bool, error)
		switch s {
		case "empty-tx":
			op = func() (bool, error) { return true, pgx.BeginFunc(ctx, pool, func(pgx.Tx) error { return nil }) }
		case "floor":
			op = func() (bool, error) { return pgFloor(ctx, pool, "k") }
		case "commit":
			op = func() (bool, error) {
				res, err := l.Commit(ctx, func(pgx.Tx) error { return nil }, txlimit.Request{Name: "bucket", Key: "k"})
				return res.OK, err
			}
		default:
			op = limit(pool, l, s)
		}
		for range n {
			if ok, err := op(); err != nil || !ok {
				b.Fatalf("%s: ok %v, err %v", s, ok, err)
			}
		}
		pool.Close()
		total, err := measure.CallgrindTotal(filepath.Join(dir, fmt.Sprintf("cg.%d", pid)))
		if err != nil {
			b.Fatal(err)
		}
		return total
	}
	const n = 100
	per := map[string]float64{}
	for range b.N {
		for _, s := range subjects {
			per[s] = float64(cost(s, 3*n)-cost(s, n)) / (2 * n)
		}
	}
	for _, s := range subjects {
		b.ReportMetric(per[s]/1000, s+"-kinstr/tx")
	}
	for _, s := range []string{"bucket", "locked"} {
		if per[s] > 0 && per["floor"] > 0 {
			b.ReportMetric(per[s]/per["floor"], s+"/floor")
		}
	}
}
