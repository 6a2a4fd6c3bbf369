package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// The migration that adds prev (the sliding window's) runs on a database
// whose rows the version before it wrote: every row is kept as it was, with
// prev 0, and every existing kind decides on it as algo decides on the row,
// as the version before did.
func TestUpgradeKeepsRowsAndDecisions(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limits := map[string]txlimit.Config{
		"bucket":  {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 20},
		"window":  {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Start: at.Add(-10 * time.Minute)},
		"sharded": {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4},
		"debt":    {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 100},
	}
	// The rows as the version before wrote them: (name, key, shard, value,
	// ts), one key per limit, ts a few seconds before the clock.
	written := []struct {
		name  string
		shard int32
		value float64
	}{
		{"bucket", 0, 3.5}, {"window", 0, 1}, {"sharded", 0, 0.25}, {"sharded", 1, 2}, {"sharded", 2, 1}, {"sharded", 3, 0}, {"debt", 0, -7},
	}
	ts := at.Add(-3 * time.Second)
	for _, tc := range []struct {
		dialect migrations.Dialect
		before  int64 // the last version before prev
		open    func(*testing.T) *sql.DB
		insert  string
		tsArg   func(time.Time) any
		store   func(*sql.DB) driver.Store[*sql.Tx]
	}{
		{migrations.SQLite, 1, sqliteDB, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES (?, 'k', ?, ?, ?)`,
			func(t time.Time) any { return t.UnixMicro() }, func(db *sql.DB) driver.Store[*sql.Tx] { return sqlitestore.New(db) }},
		{migrations.Postgres, 3, func(t *testing.T) *sql.DB {
			pool := testdb.Pool(t, testdb.EmptySchema(t), pgx.QueryExecModeCacheStatement, 4)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ($1, 'k', $2, $3, $4)`,
			func(t time.Time) any { return t }, func(db *sql.DB) driver.Store[*sql.Tx] { return pgsqlstore.New(db) }},
	} {
		t.Run(string(tc.dialect), func(t *testing.T) {
			db := tc.open(t)
			p, err := migrations.Provider(db, tc.dialect)
			require.NoError(t, err)
			_, err = p.UpTo(ctx, tc.before)
			require.NoError(t, err)
			for _, w := range written {
				_, err := db.ExecContext(ctx, tc.insert, w.name, w.shard, w.value, tc.tsArg(ts))
				require.NoError(t, err)
			}
			require.NoError(t, migrations.Up(ctx, db, tc.dialect))

			rows, err := db.QueryContext(ctx, `SELECT name, shard, value, prev FROM txlimit ORDER BY name, shard`)
			require.NoError(t, err)
			kept := map[string]float64{}
			for rows.Next() {
				var name string
				var shard int32
				var value, prev float64
				require.NoError(t, rows.Scan(&name, &shard, &value, &prev))
				require.Zero(t, prev, "%s %d", name, shard)
				kept[fmt.Sprint(name, shard)] = value
			}
			require.NoError(t, rows.Err())
			require.Len(t, kept, len(written))
			for _, w := range written {
				require.Equal(t, w.value, kept[fmt.Sprint(w.name, w.shard)], "%s %d", w.name, w.shard)
			}

			l, err := txlimit.New(tc.store(db), limits, &txlimit.Options{Clock: func() time.Time { return at }})
			require.NoError(t, err)
			for name, c := range limits {
				lc := driver.LimitConfig{
					Config: algo.Config{Kind: algo.Kind(c.Kind), Rate: c.Rate, Period: c.Period.Microseconds(), Capacity: max(c.Capacity, c.Rate), MaxReserved: c.MaxReserved},
					Shards: max(c.Shards, 1), Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
				}
				lim := lc.Limit(name, "k")
				var had []driver.Row
				for _, w := range written {
					if w.name == name {
						had = append(had, driver.Row{Shard: w.shard, Value: w.value, TS: ts})
					}
				}
				states, _ := lim.States(had, at.UnixMicro())
				for _, count := range []float64{0.5, 1, 2.5, 6} {
					if count > lc.Config.Capacity {
						continue // an *InvalidError, not a decision
					}
					_, want := algo.TakeShards(lim.Shard(lim.Shards), states, at.UnixMicro(), count, false)
					res, err := l.Check(ctx, name, "k", txlimit.Count(count))
					require.NoError(t, err)
					require.Equal(t, want.OK, res.OK, "%s count %v", name, count)
					require.Equal(t, time.Duration(want.RetryAfter)*time.Microsecond, res.RetryAfter, "%s count %v", name, count)
					require.InDelta(t, algo.Pooled(lim.Shard(lim.Shards), states, at.UnixMicro()), res.Remaining, 1e-9, name)
				}
			}
		})
	}
}
