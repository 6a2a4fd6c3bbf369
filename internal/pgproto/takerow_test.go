package pgproto

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/algocase"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// TestTakeRowMatchesAlgo is the differential test of the one-statement takes:
// random configs, prior states, counts and clocks go through algo.Take and
// through the statement the store picks (TakeBucket, TakeWindow, or for a
// reservation TakeBucketReserve or TakeWindowReserve), which must grant exactly when algo grants and store
// exactly algo's state, bit for bit. With must (TakeCommit) it raises Denied
// exactly where it would return no row (the arithmetic is the same IEEE
// operations in the same order, and instants are exact microseconds). A
// denial must write nothing. The store's whole Take (TakeRow, then the Go
// path when it grants nothing) must match algo too.
//
// Bit for bit holds where Go rounds every operation, as on amd64 at the
// default GOAMD64=v1. The Go spec lets a compiler fuse x*y+z into one FMA
// (arm64, ppc64, s390x, amd64 v3 do), which rounds once where SQL rounds
// twice: algo's fixed-window refill, Value + Rate*float64(windows), could
// then differ from the SQL in the last bit (half an ulp of the value). An
// explicit float64(Rate*float64(windows)) in algo forbids the fusion.
func TestTakeRowMatchesAlgo(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 4)
	cases := algocase.Generate(13, 3000)
	algocase.RequireCoverage(t, cases)
	for i, c := range cases {
		name := fmt.Sprintf("case %d: %+v state %+v now %d count %v reserve %v", i, c.Limit, c.State, c.Now, c.Count, c.Reserve)
		want, wantD := c.Want()
		now := time.UnixMicro(c.Now)
		p := driver.TakeParams{Limit: c.Limit, Count: c.Count, Reserve: c.Reserve, Now: &now}
		require.True(t, driver.InSQL(p), name)

		// The statement alone.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			seed(ctx, t, tx, c)
			got, clock, ok, err := TakeRow(ctx, tx, p, false)
			require.NoError(t, err, name)
			rows := stored(ctx, t, tx, c)
			if !wantD.OK || algocase.LongReservation(c, want) {
				require.False(t, ok, "%s: algo denies, the statement grants %+v", name, got)
				algocase.RequireStored(t, c.State, rows, name+": a denial writes nothing")
				return errRollback
			}
			require.True(t, ok, "%s: algo grants %+v %+v", name, want, wantD)
			algocase.RequireBits(t, want, got, name)
			require.Equal(t, wantD, driver.Granted(c.Limit.Config, got, c.Now), name)
			require.True(t, clock.Equal(now), name)
			require.Len(t, rows, 1, name)
			algocase.RequireBits(t, want, rows[0], name+": stored")
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)

		// The statement with must: it raises where it returned no row, and
		// otherwise returns the same row.
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			seed(ctx, t, tx, c)
			got, _, ok, err := TakeRow(ctx, tx, p, true)
			if !wantD.OK || algocase.LongReservation(c, want) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, name)
				require.Equal(t, Denied, pgErr.Code, name)
				return errRollback
			}
			require.NoError(t, err, name)
			require.True(t, ok, name)
			algocase.RequireBits(t, want, got, name)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)

		// The store's Take, which falls back to the Go path on a denial.
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			seed(ctx, t, tx, c)
			res, err := Protocol{}.Take(ctx, tx, p)
			require.NoError(t, err, name)
			require.Equal(t, wantD, res.Decision, name)
			rows := stored(ctx, t, tx, c)
			if !wantD.OK {
				requireUnchanged(t, c, rows, name+": a denial writes nothing")
			} else {
				require.Len(t, rows, 1, name)
				algocase.RequireBits(t, want, rows[0], name+": stored by Take")
			}
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
	}
}

var errRollback = errors.New("rolled back")

// seed stores c's prior row, if it has one, in tx.
func seed(ctx context.Context, t *testing.T, tx pgx.Tx, c algocase.Case) {
	t.Helper()
	_, err := tx.Exec(ctx, `DELETE FROM txlimit WHERE name = $1 AND key = $2`, c.Limit.Name, c.Limit.Key)
	require.NoError(t, err)
	if c.State != nil {
		_, err = tx.Exec(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ($1, $2, 0, $3, $4)`,
			c.Limit.Name, c.Limit.Key, c.State.Value, time.UnixMicro(c.State.TS))
		require.NoError(t, err)
	}
}

func stored(ctx context.Context, t *testing.T, tx pgx.Tx, c algocase.Case) []algo.State {
	t.Helper()
	rows, err := tx.Query(ctx, `SELECT value, ts FROM txlimit WHERE name = $1 AND key = $2`, c.Limit.Name, c.Limit.Key)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (algo.State, error) {
		var s algo.State
		var ts time.Time
		err := r.Scan(&s.Value, &ts)
		s.TS = ts.UnixMicro()
		return s, err
	})
	require.NoError(t, err)
	return out
}

// requireUnchanged is algocase.RequireStored for the store's whole Take,
// whose locked path creates a missing row before it locks it (INSERT … ON
// CONFLICT DO NOTHING): a denial may leave that row, full (algo.Full), which
// is the same state as no row.
func requireUnchanged(t *testing.T, c algocase.Case, rows []algo.State, msg string) {
	t.Helper()
	if c.State == nil && len(rows) == 1 {
		algocase.RequireBits(t, c.Limit.Full(), rows[0], msg+": the row the locked path created")
		return
	}
	algocase.RequireStored(t, c.State, rows, msg)
}

// A key whose rows were written under Shards 4 (the store writes that count
// on them, migration 00009) and is now taken with Shards 1 is pooled into
// one row (driver.Decide), not served from shard 0 alone: TakeRow leaves it
// to the Go path.
func TestTakeRowLeavesReshardToGo(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
	now := time.UnixMicro(1_700_000_000_000_000)
	l := driver.Limit{Name: "reshard", Key: "k", Shards: 1,
		Config: algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
	var had []driver.Row
	for shard := range 4 {
		had = append(had, driver.Row{Shard: int32(shard), Value: 0.5, TS: now})
		_, err := pool.Exec(ctx, `INSERT INTO txlimit (name, key, shard, value, ts, shards) VALUES ($1, $2, $3, 0.5, $4, 4)`, l.Name, l.Key, shard, now)
		require.NoError(t, err)
	}
	p := driver.TakeParams{Limit: l, Count: 0.25, Now: &now} // shard 0 alone has it
	decided, _ := driver.Decide(p, had, now)
	want, wantD := decided.States, decided.Decision
	require.True(t, wantD.OK, "the four shards pool 2 tokens")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := Protocol{}.Take(ctx, tx, p)
		require.NoError(t, err)
		require.Equal(t, wantD, res.Decision)
		rows := stored(ctx, t, tx, algocase.Case{Limit: l})
		require.Len(t, rows, 1, "the extra shards are deleted")
		algocase.RequireBits(t, want[0], rows[0], "pooled")
		return nil
	}))
}

// The store keeps the rule TakeRow and the sharded fast path rely on
// (migration 00009): every row holds the number of shards of its key's
// layout. A key taken unsharded, then under Shards 4, then unsharded again
// is pooled when Shards goes back to 1, and TakeRow serves it in one
// statement once the Go path has deleted the rows beyond shard 0.
func TestShardsFollowLayout(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
	now := time.UnixMicro(1_700_000_000_000_000)
	cfg := algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 3_600_000_000, Capacity: 8}
	limit := func(shards int) driver.Limit {
		return driver.Limit{Name: "layout", Key: "k", Shards: shards, Config: cfg}
	}
	type row struct{ shard, shards int32 }
	rows := func() []row {
		t.Helper()
		rs, err := pool.Query(ctx, `SELECT shard, shards FROM txlimit WHERE name = 'layout' AND key = 'k' ORDER BY shard`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.shard, &x.shards)
		})
		require.NoError(t, err)
		return out
	}
	take := func(l driver.Limit, count float64) driver.TakeResult {
		t.Helper()
		var res driver.TakeResult
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			res, err = Protocol{}.Take(ctx, tx, driver.TakeParams{Limit: l, Count: count, Now: &now})
			return err
		}))
		require.True(t, res.Decision.OK)
		return res
	}
	inSQL := func(l driver.Limit) bool {
		t.Helper()
		var ok bool
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			_, _, ok, err = TakeRow(ctx, tx, driver.TakeParams{Limit: l, Count: 0, Now: &now}, false)
			return err
		}))
		return ok
	}

	take(limit(1), 1)
	require.Equal(t, []row{{0, 1}}, rows(), "created by the one-statement take")
	take(limit(4), 1)
	require.Equal(t, []row{{0, 4}, {1, 4}, {2, 4}, {3, 4}}, rows(), "resharded to 4")
	take(limit(4), 1)
	require.Equal(t, []row{{0, 4}, {1, 4}, {2, 4}, {3, 4}}, rows(), "the fast path keeps the layout")
	require.False(t, inSQL(limit(1)), "a sharded key is left to the Go path")
	res := take(limit(1), 1)
	require.InDelta(t, 4, res.States[0].Value, 1e-9, "the four shards pooled: 8 - 1 - 1 - 1 - 1")
	require.Equal(t, []row{{0, 1}}, rows(), "back to 1: the rows beyond shard 0 deleted")
	require.True(t, inSQL(limit(1)), "served in one statement again")
}

// leastGranting is the boundary of algo's own test: at it a take of the
// target fits on a row of that value and no elapsed time, one float64
// below it does not.
func TestLeastGranting(t *testing.T) {
	fits := func(c algo.Config, value, count float64) bool {
		_, d := algo.Take(c, algo.State{Value: value}, 0, count, false)
		return d.OK
	}
	for _, cs := range algocase.Generate(7, 2000) {
		c, count := cs.Limit.Config, cs.Count
		if count > c.Capacity {
			continue // not a Take without reserve
		}
		at := leastGranting(c, count)
		require.False(t, math.IsInf(at, 0), "%+v count %v", c, count)
		require.True(t, fits(c, at, count), "%+v count %v: at %v", c, count, at)
		require.False(t, fits(c, math.Nextafter(at, math.Inf(-1)), count), "%+v count %v: below %v", c, count, at)
	}
	c := algo.Config{Kind: algo.TokenBucket, Rate: 1, Period: 1, Capacity: 10}
	require.Equal(t, math.Inf(1), leastGranting(c, 11), "beyond the capacity nothing fits")
	require.Equal(t, math.Inf(-1), debtAt(c, 11), "no cap on the debt")
}

// A paused key's row is left to the Go path by every one-statement take,
// which writes nothing, and so is a row whose pause has ended, until the Go
// path's write clears it (paused_until NULL, migration 00011): the next take
// is one statement again.
func TestTakeRowLeavesPausesToGo(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2)
	now := time.UnixMicro(1_700_000_000_000_000)
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		for _, reserve := range []bool{false, true} {
			l := driver.Limit{Name: fmt.Sprintf("pause-%d-%v", kind, reserve), Key: "k", Shards: 1,
				Config: algo.Config{Kind: kind, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
			p := driver.TakeParams{Limit: l, Count: 1, Reserve: reserve, Now: &now}
			_, err := pool.Exec(ctx, `INSERT INTO txlimit (name, key, shard, value, ts, paused_until) VALUES ($1, $2, 0, 4, $3, $4)`,
				l.Name, l.Key, now.Add(-time.Second), now.Add(time.Minute))
			require.NoError(t, err)
			takeRow := func() bool {
				var ok bool
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
					_, _, ok, err = TakeRow(ctx, tx, p, false)
					return err
				}))
				return ok
			}
			require.False(t, takeRow(), "a paused key taken in one statement")
			_, err = pool.Exec(ctx, `UPDATE txlimit SET paused_until = $3 WHERE name = $1 AND key = $2`, l.Name, l.Key, now)
			require.NoError(t, err)
			require.False(t, takeRow(), "a pause that has ended is the Go path's to clear")
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				res, err := Protocol{}.Take(ctx, tx, p)
				require.True(t, res.Decision.OK)
				require.False(t, res.Paused)
				return err
			}))
			var cleared bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT paused_until IS NULL FROM txlimit WHERE name = $1 AND key = $2`, l.Name, l.Key).Scan(&cleared))
			require.True(t, cleared)
			require.True(t, takeRow(), "the key is taken in one statement again")
		}
	}
}
