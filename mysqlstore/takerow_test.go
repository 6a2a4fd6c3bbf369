package mysqlstore_test

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
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/mysqlstore"
	"github.com/txlimit/txlimit/mysqlstore/internal/takerow"
)

// TestTakeRowMatchesAlgo is the differential test of the one-statement take
// on MySQL: random configs, prior states, counts and clocks go through
// algo.Take and through the statement of package takerow, which must grant exactly when algo
// grants and store exactly algo's state, bit for bit (DOUBLE is IEEE
// arithmetic, TIMESTAMPDIFF and TIMESTAMPADD on DATETIME(6) exact). A
// denial must write nothing. The store's whole Take must match algo too.
func TestTakeRowMatchesAlgo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Database(t, 2)
	store := driver.OpsOf[*sql.Tx](mysqlstore.New(db))
	cases := algocase.Generate(27, 1000)
	algocase.RequireCoverage(t, cases)
	// run runs fn in a transaction that it rolls back, on c's prior row.
	run := func(c algocase.Case, fn func(tx *sql.Tx)) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback()) }()
		seed(ctx, t, tx, c)
		fn(tx)
	}
	for i, c := range cases {
		name := fmt.Sprintf("case %d: %+v state %+v now %d count %v reserve %v", i, c.Limit, c.State, c.Now, c.Count, c.Reserve)
		want, wantD := c.Want()
		now := time.UnixMicro(c.Now)
		p := driver.TakeParams{Limit: c.Limit, Count: c.Count, Reserve: c.Reserve, Now: &now}
		require.True(t, driver.InSQL(p), name)

		for _, f := range []struct{ returning, serverClock bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			returning := f.returning // MySQL's two statements, MariaDB's RETURNING
			if f.serverClock && c.Now < 1e6 {
				continue // the server's clock starts after the epoch
			}
			run(c, func(tx *sql.Tx) {
				name := fmt.Sprintf("%s (RETURNING %v, server clock %v)", name, returning, f.serverClock)
				clock := &now
				if f.serverClock {
					// The server's clock, set to the case's: UTC_TIMESTAMP(6)
					// reads the session's timestamp.
					_, err := tx.ExecContext(ctx, fmt.Sprintf("SET timestamp = %d.%06d", c.Now/1e6, c.Now%1e6))
					require.NoError(t, err, name)
					defer func() { _, err := tx.ExecContext(ctx, "SET timestamp = DEFAULT"); require.NoError(t, err, name) }()
					clock = nil
				}
				r, err := takerow.Run(ctx, tx, p, clock, returning)
				require.NoError(t, err, name)
				granted := r.Read && r.Granted
				rows := stored(ctx, t, tx, c)
				if !wantD.OK || algocase.LongReservation(c, want) {
					require.False(t, granted, "%s: algo denies, the statement grants %+v", name, r)
					algocase.RequireStored(t, c.State, rows, name+": a denial writes nothing")
					return
				}
				if !r.Ran {
					// A call that does not fit a full bucket without a
					// reservation is left to the locked path unsent: a
					// reservation on a new key, or a count above Capacity.
					require.True(t, p.Reserve || c.Count > c.Limit.Config.Capacity, name)
					return
				}
				if !granted && !returning && c.State != nil && r.Affected == 0 && want == *c.State {
					// A grant that changes nothing (Count 0 within a window)
					// counts no affected row: the store's locked path grants
					// it again, to the same effect (the Take below).
					algocase.RequireStored(t, c.State, rows, name+": nothing to write")
					return
				}
				require.True(t, granted, "%s: algo grants %+v %+v, the statement: %+v", name, want, wantD, r)
				require.Equal(t, wantD, driver.Granted(c.Limit.Config, algo.State{Value: r.Value, TS: r.TS.UnixMicro()}, c.Now), name)
				algocase.RequireBits(t, want, algo.State{Value: r.Value, TS: r.TS.UnixMicro()}, name)
				require.Equal(t, now.UTC(), r.Clock, name)
				require.Len(t, rows, 1, name)
				algocase.RequireBits(t, want, rows[0], name+": stored")
			})
		}
		run(c, func(tx *sql.Tx) {
			res, err := store.Take(ctx, tx, p)
			require.NoError(t, err, name)
			algocase.RequireTake(t, c, res.Decision, stored(ctx, t, tx, c), name)
		})
	}
}

// seed stores c's prior row, if it has one, in tx.
func seed(ctx context.Context, t *testing.T, tx *sql.Tx, c algocase.Case) {
	t.Helper()
	_, err := tx.ExecContext(ctx, "DELETE FROM txlimit WHERE name = ? AND `key` = ?", []byte(c.Limit.Name), []byte(c.Limit.Key))
	require.NoError(t, err)
	if c.State != nil {
		_, err = tx.ExecContext(ctx, "INSERT INTO txlimit (name, `key`, shard, value, prev, ts) VALUES (?, ?, 0, ?, ?, ?)",
			[]byte(c.Limit.Name), []byte(c.Limit.Key), c.State.Value, c.State.Prev, time.UnixMicro(c.State.TS).UTC())
		require.NoError(t, err)
	}
}

func stored(ctx context.Context, t *testing.T, tx *sql.Tx, c algocase.Case) []algo.State {
	t.Helper()
	rows, err := tx.QueryContext(ctx, "SELECT value, prev, ts FROM txlimit WHERE name = ? AND `key` = ?", []byte(c.Limit.Name), []byte(c.Limit.Key))
	require.NoError(t, err)
	defer rows.Close()
	var out []algo.State
	for rows.Next() {
		var s algo.State
		var ts time.Time
		require.NoError(t, rows.Scan(&s.Value, &s.Prev, &ts))
		s.TS = ts.UnixMicro()
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// A key whose rows were written under Shards 4 and is now taken with Shards
// 1 is pooled into one row (driver.Decide), not served from shard 0 alone:
// the store marks row 0 of a sharded limit (its prev holds the number of
// shards), and the one statement leaves a marked row to the locked path.
func TestTakeRowLeavesReshardToGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Database(t, 2)
	s := driver.OpsOf[*sql.Tx](mysqlstore.New(db))
	now := time.UnixMicro(1_700_000_000_000_000).UTC()
	l := driver.Limit{Name: "reshard", Key: "k", Shards: 1,
		Config: algo.Config{Kind: algo.TokenBucket, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
	sharded := l
	sharded.Shards = 4
	require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
		res, err := s.Take(ctx, tx, driver.TakeParams{Limit: sharded, Count: 6, Now: &now})
		require.True(t, res.Decision.OK)
		return err
	}))
	var had []driver.Row
	for _, r := range storedRows(ctx, t, db, l) {
		require.InDelta(t, 0.5, r.Value, 1e-12, "8 - 6 spread over 4 shards")
		had = append(had, r)
	}
	require.Len(t, had, 4)
	require.EqualValues(t, 4, had[0].Prev, "row 0 of a sharded limit is marked")
	for _, count := range []float64{0.25, 1.5} { // shard 0 alone has the first, the pool the second
		p := driver.TakeParams{Limit: l, Count: count, Now: &now}
		want, _ := driver.Decide(p, had, now)
		wantD := want.Decision
		require.True(t, wantD.OK, "the four shards pool 2 tokens")
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }() // a failure must not leave its locks to the cleanup's DROP DATABASE
		res, err := s.Take(ctx, tx, p)
		require.NoError(t, err)
		require.Equal(t, wantD, res.Decision)
		rows := stored(ctx, t, tx, algocase.Case{Limit: l})
		require.Len(t, rows, 1, "the extra shards are deleted")
		algocase.RequireBits(t, want.States[0], rows[0], "pooled")
		require.Zero(t, rows[0].Prev, "an unsharded row is unmarked")
		require.NoError(t, tx.Rollback())
	}
}

// storedRows reads every row of l's key.
func storedRows(ctx context.Context, t *testing.T, db *sql.DB, l driver.Limit) []driver.Row {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT shard, value, prev, ts FROM txlimit WHERE name = ? AND `key` = ? ORDER BY shard",
		[]byte(l.Name), []byte(l.Key))
	require.NoError(t, err)
	defer rows.Close()
	var out []driver.Row
	for rows.Next() {
		var r driver.Row
		require.NoError(t, rows.Scan(&r.Shard, &r.Value, &r.Prev, &r.TS))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// A paused key's row is left to the Go path by every form of the
// one-statement take, which writes nothing, and so is a row whose pause has
// ended, until the Go path's write clears it (paused_until NULL): the next
// take is one statement again.
func TestTakeRowLeavesPausesToGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Database(t, 2)
	store := driver.OpsOf[*sql.Tx](mysqlstore.New(db))
	now := time.UnixMicro(1_700_000_000_000_000).UTC()
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		for _, form := range []struct{ reserve, serverClock bool }{{false, false}, {true, false}, {false, true}} {
			l := driver.Limit{Name: fmt.Sprintf("pause-%d-%+v", kind, form), Key: "k", Shards: 1,
				Config: algo.Config{Kind: kind, Rate: 8, Period: 3_600_000_000, Capacity: 8}}
			p := driver.TakeParams{Limit: l, Count: 1, Reserve: form.reserve, Now: &now}
			_, err := db.ExecContext(ctx, "INSERT INTO txlimit (name, `key`, shard, value, ts, paused_until) VALUES (?, ?, 0, 4, ?, ?)",
				[]byte(l.Name), []byte(l.Key), now.Add(-time.Second), now.Add(time.Minute))
			require.NoError(t, err)
			takeRow := func() bool {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer func() { require.NoError(t, tx.Rollback()) }()
				clock := &now
				if form.serverClock {
					_, err := tx.ExecContext(ctx, fmt.Sprintf("SET timestamp = %d", now.Unix()))
					require.NoError(t, err)
					defer func() { _, err := tx.ExecContext(ctx, "SET timestamp = DEFAULT"); require.NoError(t, err) }()
					clock = nil
				}
				r, err := takerow.Run(ctx, tx, p, clock, false)
				require.NoError(t, err)
				return r.Read && r.Granted
			}
			require.False(t, takeRow(), "a paused key taken in one statement")
			_, err = db.ExecContext(ctx, "UPDATE txlimit SET paused_until = ? WHERE name = ? AND `key` = ?", now, []byte(l.Name), []byte(l.Key))
			require.NoError(t, err)
			require.False(t, takeRow(), "a pause that has ended is the Go path's to clear")
			require.NoError(t, store.InTx(ctx, false, func(tx *sql.Tx) error {
				res, err := store.Take(ctx, tx, p)
				require.True(t, res.Decision.OK)
				require.False(t, res.Paused)
				return err
			}))
			var cleared bool
			require.NoError(t, db.QueryRowContext(ctx, "SELECT paused_until IS NULL FROM txlimit WHERE name = ? AND `key` = ?",
				[]byte(l.Name), []byte(l.Key)).Scan(&cleared))
			require.True(t, cleared)
			require.True(t, takeRow(), "the key is taken in one statement again")
		}
	}
}
