package txlimit_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// runEdges is the suite's topic for what happens around the core: keys at
// and past their bound, limits redeployed with another Shards, and the
// Observer on every operation.
func runEdges[TTx any](t *testing.T, h harness[TTx]) {
	ctx := context.Background()
	clk := newClock()
	opts := &txlimit.Options{Clock: clk.Now}

	t.Run("key and name length", func(t *testing.T) {
		l, err := txlimit.New(h.store, nil, opts)
		require.NoError(t, err)
		cfg := txlimit.WithConfig(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour})
		name := uniqueName(t, "long")
		longest := strings.Repeat("0123456789abcdef", txlimit.MaxKeyLen/16)
		res, err := l.Limit(ctx, name, longest, cfg)
		require.NoError(t, err, "a key of MaxKeyLen bytes works on every store")
		require.True(t, res.OK)
		res, err = l.Limit(ctx, name, longest, cfg)
		require.NoError(t, err)
		require.False(t, res.OK, "and is one limit")

		_, err = l.Limit(ctx, name, longest+"x", cfg)
		var invalid *txlimit.InvalidError
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "key", invalid.Field)
		require.Contains(t, err.Error(), "SHA-256", "the error says what to do")
		require.Empty(t, h.rows(t, name, longest+"x"), "nothing written")

		_, err = l.Limit(ctx, strings.Repeat("n", txlimit.MaxNameLen+1), "k", cfg)
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "name", invalid.Field)
	})

	t.Run("resharding keeps the total", func(t *testing.T) {
		for _, tc := range []struct {
			from, to int
			kind     txlimit.Kind
		}{{1, 4, txlimit.TokenBucket}, {4, 1, txlimit.TokenBucket}, {3, 5, txlimit.FixedWindow}, {8, 2, txlimit.FixedWindow}} {
			name := uniqueName(t, "reshard")
			cfg := func(shards int) txlimit.Option {
				return txlimit.WithConfig(txlimit.Config{Kind: tc.kind, Rate: 20, Period: time.Hour, Shards: shards, Start: fwStart(tc.kind)})
			}
			l, err := txlimit.New(h.store, nil, opts)
			require.NoError(t, err)
			// Drain to 5 of 20 under the old Shards, at one instant.
			res, err := l.Limit(ctx, name, "k", cfg(tc.from), txlimit.Count(15))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Len(t, h.rows(t, name, "k"), tc.from)

			snap, err := l.Value(ctx, name, "k", cfg(tc.to))
			require.NoError(t, err)
			require.InDelta(t, 5, snap.Value, 1e-9, "%d -> %d shards: Value reads the same total", tc.from, tc.to)
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(6))
			require.NoError(t, err)
			require.False(t, res.OK, "%d -> %d shards: no tokens appear", tc.from, tc.to)
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(5))
			require.NoError(t, err)
			require.True(t, res.OK, "%d -> %d shards: none disappear", tc.from, tc.to)
			require.InDelta(t, 0, res.Remaining, 1e-9)
			require.Len(t, h.rows(t, name, "k"), tc.to)

			// And back, through LimitAll, in debt.
			res, err = l.Limit(ctx, name, "k", cfg(tc.to), txlimit.Count(2), txlimit.Reserve())
			require.NoError(t, err)
			require.True(t, res.Reserved(), "%d -> %d: %+v", tc.from, tc.to, res)
			m, err := l.LimitAll(ctx, txlimit.Req(name, "k", cfg(tc.from), txlimit.Count(0), txlimit.Reserve()))
			require.NoError(t, err)
			require.True(t, m.OK)
			require.InDelta(t, -2, m.Results[0].Remaining, 1e-9, "the debt moves with the tokens")
			require.Len(t, h.rows(t, name, "k"), tc.from)
		}
	})

	t.Run("observer sees every operation", func(t *testing.T) {
		var mu sync.Mutex
		var ops []string
		obs := txlimit.ObserverFunc(func(_ context.Context, e txlimit.Event) {
			mu.Lock()
			defer mu.Unlock()
			outcome := e.Outcome()
			if e.Op == txlimit.OpValue || e.Op == txlimit.OpCredit || e.Op == txlimit.OpReset || e.Op == txlimit.OpPrune {
				outcome = "ok"
				if e.Err != nil {
					outcome = "error"
				}
			}
			ops = append(ops, e.Op.String()+":"+outcome)
		})
		name := uniqueName(t, "observed")
		l, err := txlimit.New(h.store, map[string]txlimit.Config{
			name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		}, &txlimit.Options{Clock: clk.Now, Observer: obs})
		require.NoError(t, err)
		_, err = l.Limit(ctx, name, "k")
		require.NoError(t, err)
		_, err = l.Value(ctx, name, "k")
		require.NoError(t, err)
		require.NoError(t, l.Credit(ctx, name, "k", 1))
		require.NoError(t, l.Reset(ctx, name, "k"))
		_, err = l.Value(ctx, "no such limit", "k")
		require.ErrorIs(t, err, txlimit.ErrUnknownLimit)
		_, err = l.Prune(ctx, &txlimit.PruneOptions{MaxBatches: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"limit:allowed", "value:ok", "credit:ok", "reset:ok", "value:error", "prune:ok"}, ops)
	})
}

// fwStart aligns fixed windows to a round hour so that a frozen clock sits
// in one window.
func fwStart(kind txlimit.Kind) time.Time {
	if kind == txlimit.FixedWindow {
		return t0.Add(-time.Hour)
	}
	return time.Time{}
}

// A database without txlimit's table answers every call with an error that
// names migrations.Up, Ping reports it at startup, and FailOpen does not turn
// it into a grant: the limiter is misconfigured, not the database down.
func TestNotMigrated(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, l interface {
		Ping(context.Context) error
		Limit(context.Context, string, string, ...txlimit.Option) (txlimit.Result, error)
		Check(context.Context, string, string, ...txlimit.Option) (txlimit.Result, error)
	}) {
		for _, err := range []error{
			l.Ping(ctx),
			func() error { _, err := l.Limit(ctx, "l", "k"); return err }(),
			func() error { _, err := l.Check(ctx, "l", "k"); return err }(),
		} {
			require.ErrorIs(t, err, txlimit.ErrNotMigrated)
			require.Contains(t, err.Error(), "migrations.Up")
		}
	}
	limits := map[string]txlimit.Config{"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}
	failOpen := &txlimit.Options{FailOpen: true}

	t.Run("postgres", func(t *testing.T) {
		pool := testdb.Pool(t, "txlimit_not_migrated_"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_")), pgx.QueryExecModeCacheStatement, 2)
		l, err := txlimit.New(pgstore.New(pool), limits, failOpen)
		require.NoError(t, err)
		check(t, l)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, l.Ping(ctx), &pgErr, "the driver's error stays reachable")
		require.Equal(t, "42P01", pgErr.Code)

		migrated := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
		l, err = txlimit.New(pgstore.New(migrated), limits, failOpen)
		require.NoError(t, err)
		require.NoError(t, l.Ping(ctx))
	})
	t.Run("sqlite", func(t *testing.T) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "bare.db")+sqliteDSN)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		l, err := txlimit.New(sqlitestore.New(db), limits, failOpen)
		require.NoError(t, err)
		check(t, l)

		l, err = txlimit.New(sqlitestore.New(openSQLite(t)), limits, failOpen)
		require.NoError(t, err)
		require.NoError(t, l.Ping(ctx))
	})
	t.Run("no pool", func(t *testing.T) {
		l, err := txlimit.New(pgstore.New(nil), limits, nil)
		require.NoError(t, err)
		require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNoPool)
	})
}

// pgx's default exec mode caches prepared statements per connection; behind
// PgBouncer in transaction mode the server connection changes under it and
// the statement is gone. DEALLOCATE ALL does to the connection what the
// pooler does: the error then names the exec modes that work.
func TestPostgresLostPreparedStatement(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 1)
	l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"l": {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Second},
	}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k")
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k") // every statement of the path is prepared now
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DEALLOCATE ALL")
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k")
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "26000", pgErr.Code)
	require.Contains(t, err.Error(), "QueryExecModeExec")
}
