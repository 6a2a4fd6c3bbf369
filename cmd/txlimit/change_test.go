package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/mysqlstore"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// change, previewed and applied, against what the application's Limiter
// holds under the old and the new config (docs/config-changes.md).

func TestSQLiteChange(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	changes(t, path, func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiterWith(t, sqlitestore.New(db), limits, nil)
	})
}

func TestPostgresChange(t *testing.T) {
	t.Parallel()
	dsn := postgresDSN(t)
	changes(t, dsn, func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[pgx.Tx] {
		pool, err := pgxpool.New(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return newLimiterWith(t, pgstore.New(pool), limits, nil)
	})
}

func TestMySQLChange(t *testing.T) {
	t.Parallel()
	cfg := mysqltest.EmptyDatabase(t)
	changes(t, cfg.FormatDSN(), func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiterWith(t, mysqlstore.New(db), limits, nil)
	})
}

// changes runs change on the database dsn, where the application's
// Limiter (from open, with the limits given) spends tokens. The buckets
// refill 10 tokens in 1000 hours: the numbers move by less than 1e-6
// during the test.
func changes[TTx any](t *testing.T, dsn string, open func(*testing.T, map[string]txlimit.Config) *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	ok(t, "migrate", "up", "-dsn", dsn)
	const slow = 1000 * time.Hour
	old := map[string]txlimit.Config{
		"api":   {Kind: txlimit.TokenBucket, Rate: 10, Period: slow},
		"login": {Kind: txlimit.TokenBucket, Rate: 10, Period: slow},
	}
	app := open(t, old)
	take := func(name, key string, n float64, opts ...txlimit.Option) {
		t.Helper()
		res, err := app.Limit(ctx, name, key, append(opts, txlimit.Count(n))...)
		require.NoError(t, err)
		require.True(t, res.OK, "%s/%s", name, key)
	}
	take("api", "a", 4)
	take("api", "b", 10)
	take("api", "c", 15, txlimit.Reserve())
	take("api", "full", 2)
	require.NoError(t, app.Credit(ctx, "api", "full", 2))
	take("login", "a", 4)

	dir := t.TempDir()
	file := func(name, data string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
		return path
	}
	oldFile := file("old.json", `{"api": {"kind": "token_bucket", "rate": 10, "period": "1000h"},
		"login": {"kind": "token_bucket", "rate": 10, "period": "1000h"}}`)
	newFile := file("new.json", `{"api": {"kind": "token_bucket", "rate": 10, "period": "1000h", "capacity": 20, "shards": 2},
		"login": {"kind": "sliding_window", "rate": 10, "period": "1000h"}}`)
	preview := func(args ...string) changeOutput {
		t.Helper()
		var out changeOutput
		require.NoError(t, json.Unmarshal([]byte(ok(t, append([]string{"change", "api", "-json", "-dsn", dsn, "-config", oldFile, "-to", newFile}, args...)...)), &out))
		return out
	}
	type kv struct{ now, deployed, inherited float64 }
	byKey := func(out changeOutput) map[string]kv {
		m := map[string]kv{}
		for _, k := range out.Keys {
			v := kv{now: k.Now, deployed: k.Deployed}
			if k.Inherited != nil {
				v.inherited = *k.Inherited
			}
			m[k.Key] = v
		}
		return m
	}
	requireNear := func(want, got map[string]kv) {
		t.Helper()
		require.Len(t, got, len(want))
		for key, w := range want {
			g := got[key]
			require.InDelta(t, w.now, g.now, 1e-3, key)
			require.InDelta(t, w.deployed, g.deployed, 1e-3, key)
			require.InDelta(t, w.inherited, g.inherited, 1e-3, key)
		}
	}

	// A preview writes nothing: the deploy keeps the stored tokens (the
	// full key's row holds 10 under a capacity of 20); additive adds what
	// the capacity grew.
	out := preview("-inherit", "additive")
	require.Equal(t, 4, out.Total)
	require.Equal(t, 10.0, out.FromCapacity)
	require.Equal(t, 20.0, out.ToCapacity)
	require.Zero(t, out.Applied)
	requireNear(map[string]kv{
		"a": {6, 6, 16}, "b": {0, 0, 10}, "c": {-5, -5, 5}, "full": {10, 10, 20},
	}, byKey(out))
	text := ok(t, "change", "api", "-dsn", dsn, "-config", oldFile, "-to", newFile, "-inherit", "additive")
	require.Contains(t, text, "KEY   ROWS  NOW  AFTER DEPLOY  ADDITIVE")
	require.Contains(t, text, "Nothing written.")
	res, err := app.Check(ctx, "api", "a", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 6, res.Remaining, 1e-3, "the preview wrote nothing")

	// -apply proportionally: each key holds the same share of the new
	// capacity, over the new config's 2 shards.
	out = preview("-inherit", "proportionally", "-apply")
	require.Equal(t, 4, out.Applied)
	requireNear(map[string]kv{
		"a": {6, 6, 12}, "b": {0, 0, 0}, "c": {-5, -5, -10}, "full": {10, 10, 20},
	}, byKey(out))
	newApp := open(t, map[string]txlimit.Config{
		"api":   {Kind: txlimit.TokenBucket, Rate: 10, Period: slow, Capacity: 20, Shards: 2},
		"login": {Kind: txlimit.SlidingWindow, Rate: 10, Period: slow},
	})
	for key, want := range map[string]float64{"a": 12, "b": 0, "c": -10, "full": 20} {
		res, err := newApp.Check(ctx, "api", key, txlimit.Count(0))
		require.NoError(t, err)
		require.InDelta(t, want, res.Remaining, 1e-3, key)
	}

	// A Kind change to SlidingWindow: the deploy would read the bucket's 6
	// tokens as a count of 6 (4 tokens); as_is keeps the 6 tokens.
	var login changeOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, "change", "login", "-json", "-dsn", dsn, "-config", oldFile, "-to", newFile, "-inherit", "as_is")), &login))
	requireNear(map[string]kv{"a": {6, 4, 6}}, byKey(login))
	ok(t, "change", "login", "-dsn", dsn, "-config", oldFile, "-to", newFile, "-inherit", "as_is", "-apply")
	res, err = newApp.Check(ctx, "login", "a", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 6, res.Remaining, 1e-3)
	require.False(t, must(newApp.Check(ctx, "login", "a", txlimit.Count(7))).OK)

	// Mistakes are usage errors, and write nothing.
	require.Contains(t, fails(t, exitUsage, "change", "api", "-dsn", dsn, "-config", oldFile, "-to", newFile, "-apply"), "-apply needs -inherit")
	require.Contains(t, fails(t, exitUsage, "change", "api", "-dsn", dsn, "-config", oldFile, "-to", newFile, "-inherit", "keep"), "-inherit must be as_is, proportionally, additive, reset")
	require.Contains(t, fails(t, exitUsage, "change", "api", "-dsn", dsn, "-config", oldFile), "change needs -to FILE")
	require.Contains(t, fails(t, exitUsage, "change", "other", "-dsn", dsn, "-config", oldFile, "-to", newFile), `no config for limit "other" today`)
	require.Contains(t, fails(t, exitUsage, "change", "api", "-dsn", dsn, "-to", newFile, "-kind", "token_bucket", "-rate", "10", "-period", "1000h",
		"-inherit", "reset", "-apply", "-to", file("bad.json", `{"api": {"kind": "token_bucket", "rate": -1, "period": "1h"}}`)), "Rate must be a finite number > 0")
	require.Contains(t, fails(t, exitUsage, "value", "api", "a", "-dsn", dsn, "-config", oldFile, "-to", newFile), "-to, -inherit and -apply belong to change")
	res, err = newApp.Check(ctx, "api", "a", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 12, res.Remaining, 1e-3, "the refused calls wrote nothing")
}

func must(r txlimit.Result, err error) txlimit.Result {
	if err != nil {
		panic(err)
	}
	return r
}

func TestSQLiteChangeConcurrent(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	changeConcurrent(t, path, func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_txlock=immediate")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiterWith(t, sqlitestore.New(db), limits, nil)
	})
}

func TestPostgresChangeConcurrent(t *testing.T) {
	t.Parallel()
	dsn := postgresDSN(t)
	changeConcurrent(t, dsn, func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[pgx.Tx] {
		pool, err := pgxpool.New(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return newLimiterWith(t, pgstore.New(pool), limits, nil)
	})
}

func TestMySQLChangeConcurrent(t *testing.T) {
	t.Parallel()
	cfg := mysqltest.EmptyDatabase(t)
	changeConcurrent(t, cfg.FormatDSN(), func(t *testing.T, limits map[string]txlimit.Config) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiterWith(t, mysqlstore.New(db), limits, nil)
	})
}

// changeConcurrent runs change -apply again and again on a key that 8
// goroutines take from on connections of their own: a conversion that
// changes nothing (as_is, the same config) must lose no take, since it
// converts the key under its rows' lock.
func changeConcurrent[TTx any](t *testing.T, dsn string, open func(*testing.T, map[string]txlimit.Config) *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	ok(t, "migrate", "up", "-dsn", dsn)
	limits := map[string]txlimit.Config{"api": {Kind: txlimit.TokenBucket, Rate: 1000, Period: 100000 * time.Hour}}
	app := open(t, limits)
	config := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(config, []byte(`{"api": {"kind": "token_bucket", "rate": 1000, "period": "100000h"}}`), 0o600))
	res, err := app.Limit(ctx, "api", "hot")
	require.NoError(t, err)
	require.True(t, res.OK)

	const workers, takes = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*takes)
	for range workers {
		wg.Go(func() {
			for range takes {
				res, err := app.Limit(ctx, "api", "hot")
				switch {
				case err != nil:
					errs <- err
				case !res.OK:
					errs <- fmt.Errorf("denied: %+v", res)
				}
			}
		})
	}
	applies := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		ok(t, "change", "api", "-dsn", dsn, "-config", config, "-to", config, "-inherit", "as_is", "-apply")
		applies++
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	res, err = app.Check(ctx, "api", "hot", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 1000-1-workers*takes, res.Remaining, 1e-3, "after %d conversions", applies)
	require.GreaterOrEqual(t, applies, 2)
	t.Logf("%d conversions while %d takes ran", applies, workers*takes)
}
