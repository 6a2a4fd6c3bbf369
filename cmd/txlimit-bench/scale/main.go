// Command scale measures txlimit's table at many keys on PostgreSQL: the
// share of its updates that stay HOT (heap-only tuples: the new version of
// the row on the same page, no index entry), its bytes per key, LimitTx's
// throughput on uniformly random keys, and how fast Prune deletes the rows
// of keys that are full again.
//
//	cd cmd/txlimit-bench && go run ./scale -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// For each key count (-keys) and each fillfactor (-fillfactor; "migration"
// is the one the migrations set) it creates a schema of its own, runs the
// migrations, sets the fillfactor, loads the keys (each key's row as a first
// LimitTx would leave it, written by one INSERT … SELECT generate_series),
// and runs -clients clients, each calling LimitTx on a uniformly random key
// in pgx.BeginFunc for -duration. The counters of pg_stat_user_tables
// before and after the run give the HOT share of its updates; the table's
// size with its index and TOAST after the run, divided by the keys, the
// bytes per key. Then the clock moves an hour on (Options.Clock), every key
// is full again, and Prune deletes them all: rows a second. The schema is
// dropped at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL connection string (required)")
	keysFlag := flag.String("keys", "10000,1000000", "key counts, comma-separated")
	ffFlag := flag.String("fillfactor", "migration,100", `fillfactors of the txlimit table, comma-separated; "migration" keeps the migrations' own`)
	clients := flag.Int("clients", 8, "concurrent clients")
	duration := flag.Duration("duration", 20*time.Second, "how long the clients run at each setting")
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "scale: -dsn is required")
		os.Exit(2)
	}
	ctx := context.Background()
	fmt.Printf("| keys | fillfactor | LimitTx/s | updates | HOT | bytes/key | Prune rows/s |\n|---|---|---|---|---|---|---|\n")
	for _, k := range strings.Split(*keysFlag, ",") {
		keys, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || keys < 1 {
			fail(fmt.Errorf("-keys: %q is not a positive count", k))
		}
		for _, ff := range strings.Split(*ffFlag, ",") {
			r, err := measure(ctx, *dsn, keys, strings.TrimSpace(ff), *clients, *duration)
			if err != nil {
				fail(err)
			}
			fmt.Printf("| %d | %s | %.0f | %d | %.1f%% | %.0f | %.0f |\n",
				keys, r.fillfactor, r.opsPerSec, r.updates, 100*r.hotShare, r.bytesPerKey, r.pruneRowsPerSec)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale:", err)
	os.Exit(1)
}

type result struct {
	fillfactor      string
	opsPerSec       float64
	updates         int64
	hotShare        float64
	bytesPerKey     float64
	pruneRowsPerSec float64
}

func measure(ctx context.Context, dsn string, keys int, ff string, clients int, d time.Duration) (result, error) {
	schema := fmt.Sprintf("txlimit_scale_%d", time.Now().UnixNano())
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return result{}, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return result{}, err
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // best effort at the end

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return result{}, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = int32(clients + 1)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		return result{}, err
	}
	if ff != "migration" {
		if _, err := pool.Exec(ctx, "ALTER TABLE txlimit SET (fillfactor = "+ff+")"); err != nil {
			return result{}, err
		}
	}
	var opts string
	if err := pool.QueryRow(ctx, "SELECT coalesce(array_to_string(reloptions, ','), 'default') FROM pg_class WHERE oid = 'txlimit'::regclass").Scan(&opts); err != nil {
		return result{}, err
	}
	out := result{fillfactor: ff + " (" + opts + ")"}

	// A clock an hour behind: the rows loaded at the server's now are
	// taken from without refill during the run, and full an hour later.
	start := time.Now()
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	const name = "scale"
	limits := map[string]txlimit.Config{name: {Kind: txlimit.TokenBucket, Rate: 1e6, Period: time.Hour}}
	l, err := txlimit.New(pgstore.New(pool), limits, &txlimit.Options{Clock: clock})
	if err != nil {
		return result{}, err
	}
	// Each key's row as its first LimitTx leaves it: one token taken.
	if _, err := pool.Exec(ctx, `INSERT INTO txlimit (name, key, shard, value, ts)
		SELECT $1, 'k' || g, 0, 999999, $2 FROM generate_series(1, $3) AS g`, name, start, keys); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE txlimit"); err != nil {
		return result{}, err
	}
	upd0, hot0, err := counters(ctx, pool)
	if err != nil {
		return result{}, err
	}
	var ops atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for range clients {
		wg.Go(func() {
			for runCtx.Err() == nil {
				key := "k" + strconv.Itoa(1+rand.IntN(keys))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					res, err := l.LimitTx(ctx, tx, name, key)
					if err == nil && !res.OK {
						err = fmt.Errorf("key %s denied", key)
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return result{}, err
	}
	out.opsPerSec = float64(ops.Load()) / d.Seconds()
	// The server reports a backend's counters at most once a second.
	time.Sleep(1500 * time.Millisecond)
	upd1, hot1, err := counters(ctx, pool)
	if err != nil {
		return result{}, err
	}
	out.updates = upd1 - upd0
	if out.updates > 0 {
		out.hotShare = float64(hot1-hot0) / float64(out.updates)
	}
	var size int64
	if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size('txlimit')").Scan(&size); err != nil {
		return result{}, err
	}
	out.bytesPerKey = float64(size) / float64(keys)

	// An hour later every key is full: Prune deletes every row.
	offset.Store(int64(2 * time.Hour))
	pruneStart := time.Now()
	pruned, err := l.Prune(ctx, nil)
	if err != nil {
		return result{}, err
	}
	if pruned.Deleted != keys {
		return result{}, fmt.Errorf("prune deleted %d rows of %d keys", pruned.Deleted, keys)
	}
	out.pruneRowsPerSec = float64(pruned.Deleted) / time.Since(pruneStart).Seconds()
	return out, nil
}

// counters are the txlimit table's updates and HOT updates so far.
func counters(ctx context.Context, pool *pgxpool.Pool) (upd, hot int64, err error) {
	err = pool.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'txlimit'::regclass").Scan(&upd, &hot)
	return upd, hot, err
}
