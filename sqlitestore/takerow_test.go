package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/algocase"
)

// TestTakeRowMatchesAlgo is the differential test of the one-statement take
// on SQLite: random configs, prior states, counts and clocks go through
// algo.Take and through takeRowSQL, which must grant exactly when algo
// grants and store exactly algo's state, bit for bit. A denial must write
// nothing. The store's whole Take must match algo too.
//
// Bit for bit holds where Go rounds every operation, as on amd64 at the
// default GOAMD64=v1. The Go spec lets a compiler fuse x*y+z into one FMA
// (arm64, ppc64, s390x, amd64 v3 do), which rounds once where SQL rounds
// twice: algo's fixed-window refill, Value + Rate*float64(windows), could
// then differ from the SQL in the last bit (half an ulp of the value). An
// explicit float64(Rate*float64(windows)) in algo forbids the fusion.
func TestTakeRowMatchesAlgo(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDB(t))
	cases := algocase.Generate(13, 3000)
	algocase.RequireCoverage(t, cases)
	run := func(fn func(tx *sql.Tx)) {
		tx, err := s.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback()) }()
		fn(tx)
	}
	for i, c := range cases {
		name := fmt.Sprintf("case %d: %+v state %+v now %d count %v reserve %v", i, c.Limit, c.State, c.Now, c.Count, c.Reserve)
		want, wantD := c.Want()
		now := time.UnixMicro(c.Now)
		p := driver.TakeParams{Limit: c.Limit, Count: c.Count, Reserve: c.Reserve, Now: &now}
		require.True(t, driver.InSQL(p), name)

		run(func(tx *sql.Tx) {
			seed(ctx, t, tx, c)
			res, done, err := s.takeRow(ctx, tx, p, now)
			require.NoError(t, err, name)
			rows := stored(ctx, t, tx, c)
			if !wantD.OK || algocase.LongReservation(c, want) {
				require.False(t, done, "%s: algo denies, the statement grants %+v", name, res)
				algocase.RequireStored(t, c.State, rows, name+": a denial writes nothing")
				return
			}
			require.True(t, done, "%s: algo grants %+v %+v", name, want, wantD)
			require.Equal(t, wantD, res.Decision, name)
			require.Len(t, res.States, 1, name)
			algocase.RequireBits(t, want, res.States[0], name)
			require.Len(t, rows, 1, name)
			algocase.RequireBits(t, want, rows[0], name+": stored")
		})
		run(func(tx *sql.Tx) {
			seed(ctx, t, tx, c)
			res, err := s.Take(ctx, tx, p)
			require.NoError(t, err, name)
			algocase.RequireTake(t, c, res.Decision, stored(ctx, t, tx, c), name)
		})
	}
}

// seed stores c's prior row, if it has one, in tx.
func seed(ctx context.Context, t *testing.T, tx *sql.Tx, c algocase.Case) {
	t.Helper()
	_, err := tx.ExecContext(ctx, `DELETE FROM txlimit WHERE name = ? AND key = ?`, c.Limit.Name, c.Limit.Key)
	require.NoError(t, err)
	if c.State != nil {
		_, err = tx.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES (?, ?, 0, ?, ?)`,
			c.Limit.Name, c.Limit.Key, c.State.Value, c.State.TS)
		require.NoError(t, err)
	}
}

func stored(ctx context.Context, t *testing.T, tx *sql.Tx, c algocase.Case) []algo.State {
	t.Helper()
	rows, err := tx.QueryContext(ctx, `SELECT value, ts FROM txlimit WHERE name = ? AND key = ?`, c.Limit.Name, c.Limit.Key)
	require.NoError(t, err)
	defer rows.Close()
	var out []algo.State
	for rows.Next() {
		var s algo.State
		require.NoError(t, rows.Scan(&s.Value, &s.TS))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// A key whose rows were written under Shards 4 and is now taken with Shards
// 1 is pooled into one row (driver.Decide), not served from shard 0 alone:
// takeRowSQL leaves it to the Go path.
func TestTakeRowLeavesReshardToGo(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDB(t))
	now := time.UnixMicro(1_700_000_000_000_000)
	l := driver.Limit{Name: "reshard", Key: "k", Shards: 1,
		Config: algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
	var had []driver.Row
	for shard := range 4 {
		had = append(had, driver.Row{Shard: int32(shard), Value: 0.5, TS: now})
		_, err := s.db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES (?, ?, ?, 0.5, ?)`, l.Name, l.Key, shard, now.UnixMicro())
		require.NoError(t, err)
	}
	p := driver.TakeParams{Limit: l, Count: 0.25, Now: &now} // shard 0 alone has it
	decided, _ := driver.Decide(p, had, now)
	want, wantD := decided.States, decided.Decision
	require.True(t, wantD.OK, "the four shards pool 2 tokens")
	require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
		res, err := s.Take(ctx, tx, p)
		require.NoError(t, err)
		require.Equal(t, wantD, res.Decision)
		rows := stored(ctx, t, tx, algocase.Case{Limit: l})
		require.Len(t, rows, 1, "the extra shards are deleted")
		algocase.RequireBits(t, want[0], rows[0], "pooled")
		return nil
	}))
}

// A paused key's row is left to the Go path by takeRowSQL, which writes
// nothing, and so is a row whose pause has ended, until the Go path's write
// clears it (paused_until NULL): the next take is one statement again.
func TestTakeRowLeavesPausesToGo(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDB(t))
	now := time.UnixMicro(1_700_000_000_000_000)
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		for _, reserve := range []bool{false, true} {
			l := driver.Limit{Name: fmt.Sprintf("pause-%d-%v", kind, reserve), Key: "k", Shards: 1,
				Config: algo.Config{Kind: kind, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
			p := driver.TakeParams{Limit: l, Count: 1, Reserve: reserve, Now: &now}
			_, err := s.db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts, paused_until) VALUES (?, ?, 0, 4, ?, ?)`,
				l.Name, l.Key, now.Add(-time.Second).UnixMicro(), now.Add(time.Minute).UnixMicro())
			require.NoError(t, err)
			takeRow := func() bool {
				var ok bool
				require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
					_, ok, err = s.TakeRow(ctx, tx, p)
					return err
				}))
				return ok
			}
			require.False(t, takeRow(), "a paused key taken in one statement")
			_, err = s.db.ExecContext(ctx, `UPDATE txlimit SET paused_until = ? WHERE name = ? AND key = ?`, now.UnixMicro(), l.Name, l.Key)
			require.NoError(t, err)
			require.False(t, takeRow(), "a pause that has ended is the Go path's to clear")
			require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
				res, err := s.Take(ctx, tx, p)
				require.True(t, res.Decision.OK)
				require.False(t, res.Paused)
				return err
			}))
			var cleared bool
			require.NoError(t, s.db.QueryRowContext(ctx, `SELECT paused_until IS NULL FROM txlimit WHERE name = ? AND key = ?`, l.Name, l.Key).Scan(&cleared))
			require.True(t, cleared)
			require.True(t, takeRow(), "the key is taken in one statement again")
		}
	}
}
