package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sqlite "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/sqlitestore"
)

// recommended is the configuration the package documentation asks for.
const recommended = "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// SQLite result codes (https://sqlite.org/rescode.html).
const (
	sqliteBusy         = 5
	sqliteBusySnapshot = 5 | 2<<8
)

// openDB opens a fresh database file with the given DSN parameters and runs
// the migrations.
func openDB(t *testing.T, params string) *sql.DB {
	t.Helper()
	db := openBareDB(t, params)
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

// openBareDB opens a fresh database file without running the migrations.
func openBareDB(t *testing.T, params string) *sql.DB {
	t.Helper()
	dsn := "file:" + testdb.SQLitePath(t)
	if params != "" {
		dsn += "?" + params
	}
	db, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// sqliteCode returns the SQLite result code in err's chain, or 0.
func sqliteCode(err error) int {
	var e *sqlite.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return 0
}

func requireBusy(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, sqliteBusy, sqliteCode(err)&0xff, "want SQLITE_BUSY, got %v", err)
}

// requireBusyAdvice checks that a store's error is SQLITE_BUSY and that its
// message names the DSN settings that avoid it.
func requireBusyAdvice(t *testing.T, err error) {
	t.Helper()
	requireBusy(t, err)
	require.ErrorContains(t, err, "busy_timeout")
	require.ErrorContains(t, err, "_txlock=immediate")
}

// inTx runs fn in a transaction of store and fails the test on error.
func inTx(t *testing.T, s driver.Ops[*sql.Tx], fn func(tx *sql.Tx)) {
	t.Helper()
	require.NoError(t, s.InTx(context.Background(), false, func(tx *sql.Tx) error { fn(tx); return nil }))
}

// bucket is a token bucket limit of capacity tokens in total over shards
// rows, refilling one token per 1000 hours: under a frozen clock nothing
// refills between calls.
func bucket(name, key string, capacity float64, shards int) driver.Limit {
	return driver.Limit{Name: name, Key: key, Shards: shards, Config: algo.Config{
		Kind: algo.TokenBucket, Rate: 1, Period: (1000 * time.Hour).Microseconds(), Capacity: capacity,
	}}
}

// rw is a driver.Row.
func rw(shard int32, value float64, ts time.Time) driver.Row {
	return driver.Row{Shard: shard, Value: value, TS: ts}
}

// take runs Take and fails the test on error.
func take(t *testing.T, s driver.Ops[*sql.Tx], tx *sql.Tx, p driver.TakeParams) driver.TakeResult {
	t.Helper()
	res, err := s.Take(context.Background(), tx, p)
	require.NoError(t, err)
	return res
}

// read runs Read in tx and fails the test on error.
func read(t *testing.T, s driver.Ops[*sql.Tx], tx *sql.Tx, name, key string, now *time.Time) driver.ReadResult {
	t.Helper()
	res, err := s.Read(context.Background(), tx, driver.ReadParams{Name: name, Key: key, Now: now})
	require.NoError(t, err)
	return res
}

// readRows reads the rows of (name, key) in a read-only transaction of its
// own.
func readRows(t *testing.T, s driver.Ops[*sql.Tx], name, key string) []driver.Row {
	t.Helper()
	var rows []driver.Row
	require.NoError(t, s.InTx(context.Background(), true, func(tx *sql.Tx) error {
		rows = read(t, s, tx, name, key, nil).Rows
		return nil
	}))
	return rows
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, recommended)
	s := ops(sqlitestore.New(db))
	// A clock with nanoseconds: the store works, and stores, at
	// microsecond precision.
	now := time.UnixMicro(1_700_000_000_123_456).Add(789 * time.Nanosecond)
	at := time.UnixMicro(1_700_000_000_123_456)
	want := []driver.Row{{Shard: 0, Value: 2.5, TS: at}, {Shard: 1, Value: 2.5, TS: at}, {Shard: 2, Value: 2.5, TS: at}}

	inTx(t, s, func(tx *sql.Tx) {
		r := read(t, s, tx, "n", "k", &now)
		require.Empty(t, r.Rows)
		require.Equal(t, at, r.At, "the clock is returned without rows")

		res := take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 9, 3), Count: 1.5, Now: &now})
		require.True(t, res.Decision.OK)
		require.Equal(t, at, res.At)
		require.Equal(t, want, bucket("n", "k", 9, 3).Rows(res.States))
		require.Equal(t, want, read(t, s, tx, "n", "k", &now).Rows, "the transaction reads its own writes")
	})
	require.Equal(t, want, readRows(t, s, "n", "k"), "committed")

	// Values that are not short decimals, and negative ones, as Take
	// writes them.
	// (The counts are variables: Go would compute constant expressions
	// exactly, the store computes in float64.)
	third := bucket("n", "third", 1, 1)
	debt := bucket("n", "debt", 1, 1)
	twoThirds, over := 2.0/3, 1+7.25e-9
	inTx(t, s, func(tx *sql.Tx) {
		require.True(t, take(t, s, tx, driver.TakeParams{Limit: third, Count: twoThirds, Now: &now}).Decision.OK)
		require.True(t, take(t, s, tx, driver.TakeParams{Limit: debt, Count: over, Reserve: true, Now: &now}).Decision.OK)
	})
	require.Equal(t, []driver.Row{{Shard: 0, Value: 1 - twoThirds, TS: at}}, readRows(t, s, "n", "third"))
	require.Equal(t, []driver.Row{{Shard: 0, Value: 1 - over, TS: at}}, readRows(t, s, "n", "debt"))
	require.Less(t, readRows(t, s, "n", "debt")[0].Value, 0.0)

	// Values and timestamps Take cannot produce, written directly, read
	// back exactly.
	_, err := db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES
		('n', 'extreme', 0, ?, ?), ('n', 'extreme', 1, ?, ?), ('n', 'extreme', 2, ?, ?)`,
		1.0/3, int64(-1), -7.25e-9, int64(1_700_000_001_999_999), math.MaxFloat64, int64(math.MaxInt64))
	require.NoError(t, err)
	require.Equal(t, []driver.Row{
		{Shard: 0, Value: 1.0 / 3, TS: time.UnixMicro(-1)},
		{Shard: 1, Value: -7.25e-9, TS: time.UnixMicro(1_700_000_001_999_999)},
		{Shard: 2, Value: math.MaxFloat64, TS: time.UnixMicro(math.MaxInt64)},
	}, readRows(t, s, "n", "extreme"))

	// ts is INTEGER microseconds and value REAL, as the migration says,
	// also when the value is a whole number.
	var tsType, valueType string
	var tsRaw int64
	require.NoError(t, db.QueryRow(`SELECT typeof(ts), typeof(value), ts FROM txlimit WHERE key = 'k' AND shard = 0`).
		Scan(&tsType, &valueType, &tsRaw))
	require.Equal(t, "integer", tsType)
	require.Equal(t, "real", valueType)
	require.Equal(t, at.UnixMicro(), tsRaw)
	inTx(t, s, func(tx *sql.Tx) {
		take(t, s, tx, driver.TakeParams{Limit: bucket("n", "whole", 10, 1), Count: 1, Now: &now})
	})
	require.NoError(t, db.QueryRow(`SELECT typeof(ts), typeof(value) FROM txlimit WHERE key = 'whole'`).Scan(&tsType, &valueType))
	require.Equal(t, "integer", tsType)
	require.Equal(t, "real", valueType)
}

// TestTakeKeepsExistingRows: on a key that has some of its rows (shards
// below the highest present are missing: full), Take decides on the rows
// there, writes nothing when it denies, and when it grants writes the
// decided state to the rows that exist and creates the missing ones,
// touching no other key.
func TestTakeKeepsExistingRows(t *testing.T) {
	for _, c := range []struct {
		name    string
		shards  int
		present map[int]float64 // shard: value
		// pooled is what the key holds; deny and grant are counts.
		deny, grant, each float64
	}{
		{name: "1-of-2", shards: 2, present: map[int]float64{1: -1}, deny: 5, grant: 3, each: 0.5},
		{name: "0-and-2-of-3", shards: 3, present: map[int]float64{0: -1, 2: 2}, deny: 7, grant: 3, each: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, recommended)
			s := ops(sqlitestore.New(db))
			now := time.UnixMicro(2_000_000)
			for shard, v := range c.present {
				_, err := db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('n', 'k', ?, ?, ?)`,
					shard, v, now.UnixMicro())
				require.NoError(t, err)
			}
			_, err := db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES
				('n', 'k2', 0, 4, 1000000), ('n', 'k2', 1, 3, 1000000), ('m', 'k', 0, 2, 1000000)`)
			require.NoError(t, err)
			before := dump(t, db)
			l := bucket("n", "k", 5*float64(c.shards), c.shards) // 5 a shard

			inTx(t, s, func(tx *sql.Tx) {
				res := take(t, s, tx, driver.TakeParams{Limit: l, Count: c.deny, Now: &now})
				require.False(t, res.Decision.OK)
			})
			require.Equal(t, before, dump(t, db), "a denial writes nothing")

			var res driver.TakeResult
			inTx(t, s, func(tx *sql.Tx) {
				res = take(t, s, tx, driver.TakeParams{Limit: l, Count: c.grant, Now: &now})
				require.True(t, res.Decision.OK)
			})
			var want []driver.Row
			for i := range c.shards {
				want = append(want, rw(int32(i), c.each, now))
			}
			require.Equal(t, want, l.Rows(res.States))
			require.Equal(t, want, readRows(t, s, "n", "k"), "the existing rows hold the decided state, and the missing ones were created")
			var others, othersBefore []row
			for _, r := range dump(t, db) {
				if r.name != "n" || r.key != "k" {
					others = append(others, r)
				}
			}
			for _, r := range before {
				if r.name != "n" || r.key != "k" {
					othersBefore = append(othersBefore, r)
				}
			}
			require.Len(t, othersBefore, 3)
			require.Equal(t, othersBefore, others, "other keys untouched")
		})
	}
}

func TestDelete(t *testing.T) {
	ctx := context.Background()
	s := ops(sqlitestore.New(openDB(t, recommended)))
	now := time.UnixMicro(1)
	keys := [][2]string{{"n", "k"}, {"n", "other"}, {"m", "k"}, {"n", ""}, {"n", "K"}, {"n", "k "}}
	inTx(t, s, func(tx *sql.Tx) {
		for _, nk := range keys {
			take(t, s, tx, driver.TakeParams{Limit: bucket(nk[0], nk[1], 2, 2), Count: 1, Now: &now})
		}
	})
	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.Reset(ctx, tx, driver.KeyRef{Name: "n", Key: "k"}))
		require.Empty(t, read(t, s, tx, "n", "k", nil).Rows, "deleted in the transaction")
		require.NoError(t, s.Reset(ctx, tx, driver.KeyRef{Name: "absent", Key: "k"}))
	})
	for _, nk := range keys {
		want := 2
		if nk == [2]string{"n", "k"} {
			want = 0
		}
		require.Len(t, readRows(t, s, nk[0], nk[1]), want, "%q", nk)
	}
}

func TestClock(t *testing.T) {
	s := ops(sqlitestore.New(openDB(t, recommended)))
	injected := time.Date(2030, 1, 2, 3, 4, 5, 6_007_008, time.UTC)
	truncated := time.UnixMicro(injected.UnixMicro())
	inTx(t, s, func(tx *sql.Tx) {
		r := read(t, s, tx, "n", "k", &injected)
		require.Empty(t, r.Rows)
		require.Equal(t, truncated, r.At, "Read returns the injected clock at µs precision")
		res := take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 2, 1), Count: 1, Now: &injected})
		require.Equal(t, truncated, res.At, "Take decides at the injected clock")
		require.Equal(t, truncated, read(t, s, tx, "n", "k", nil).Rows[0].TS, "and writes it")

		before := time.Now().Truncate(time.Microsecond)
		r = read(t, s, tx, "n", "p", nil)
		res = take(t, s, tx, driver.TakeParams{Limit: bucket("n", "p", 2, 1), Count: 1})
		after := time.Now()
		for _, a := range []time.Time{r.At, res.At} {
			require.False(t, a.Before(before) || a.After(after), "process clock %v not in [%v, %v]", a, before, after)
			require.Zero(t, a.Nanosecond()%1000, "clock at microsecond precision")
		}
		require.Equal(t, res.At, read(t, s, tx, "n", "p", nil).Rows[0].TS, "Take writes the clock it read")
	})
}

// TestShards: SQLite never serves a sharded limit from one shard; one Take
// reads and writes every shard. A limit redeployed with other Shards keeps
// its total, and a denial writes nothing.
func TestShards(t *testing.T) {
	ctx := context.Background()
	now := time.UnixMicro(42_000_000)
	total := func(rows []driver.Row) (v float64) {
		for _, r := range rows {
			v += r.Value
		}
		return v
	}

	t.Run("every-shard", func(t *testing.T) {
		s := ops(sqlitestore.New(openDB(t, recommended)))
		l := bucket("n", "k", 9, 3) // 3 a shard
		inTx(t, s, func(tx *sql.Tx) {
			res := take(t, s, tx, driver.TakeParams{Limit: l, Count: 1, Now: &now})
			require.True(t, res.Decision.OK)
			require.False(t, res.Partial)
			require.Len(t, res.States, 3)
		})
		rows := readRows(t, s, "n", "k")
		require.Equal(t, []driver.Row{rw(0, 8.0/3, now), rw(1, 8.0/3, now), rw(2, 8.0/3, now)}, rows)
		// 4 tokens: more than a shard holds, granted from the pool of the
		// three.
		inTx(t, s, func(tx *sql.Tx) {
			res := take(t, s, tx, driver.TakeParams{Limit: l, Count: 4, Now: &now})
			require.True(t, res.Decision.OK)
			require.False(t, res.Partial)
			require.Equal(t, l.Rows(res.States), read(t, s, tx, "n", "k", nil).Rows)
		})
		rows = readRows(t, s, "n", "k")
		require.Len(t, rows, 3)
		require.InDelta(t, 4.0, total(rows), 1e-12)
		for _, r := range rows {
			require.InDelta(t, 4.0/3, r.Value, 1e-12, "spread over every shard")
			require.Equal(t, now, r.TS)
		}
	})

	t.Run("1-to-3", func(t *testing.T) {
		s := ops(sqlitestore.New(openDB(t, recommended)))
		inTx(t, s, func(tx *sql.Tx) {
			require.True(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 9, 1), Count: 3, Now: &now}).Decision.OK)
		})
		require.Equal(t, []driver.Row{rw(0, 6, now)}, readRows(t, s, "n", "k"))
		inTx(t, s, func(tx *sql.Tx) {
			res := take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 9, 3), Count: 1, Now: &now})
			require.True(t, res.Decision.OK)
			require.Len(t, res.States, 3)
		})
		rows := readRows(t, s, "n", "k")
		require.Len(t, rows, 3)
		require.InDelta(t, 5.0, total(rows), 1e-12, "the 6 left, less the 1 taken")
		for i, r := range rows {
			require.Equal(t, int32(i), r.Shard)
			require.InDelta(t, 5.0/3, r.Value, 1e-12)
		}
	})

	t.Run("4-to-2", func(t *testing.T) {
		db := openDB(t, recommended)
		s := ops(sqlitestore.New(db))
		inTx(t, s, func(tx *sql.Tx) {
			require.True(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 8, 4), Count: 2, Now: &now}).Decision.OK)
		})
		require.Equal(t, []driver.Row{rw(0, 1.5, now), rw(1, 1.5, now), rw(2, 1.5, now), rw(3, 1.5, now)}, readRows(t, s, "n", "k"))
		inTx(t, s, func(tx *sql.Tx) {
			require.True(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 8, 2), Count: 1, Now: &now}).Decision.OK)
		})
		require.Equal(t, []driver.Row{rw(0, 2.5, now), rw(1, 2.5, now)}, readRows(t, s, "n", "k"),
			"the 6 left, less the 1 taken, on two rows; rows 2 and 3 deleted")
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM txlimit`).Scan(&n))
		require.Equal(t, 2, n)
	})

	t.Run("denial", func(t *testing.T) {
		db := openDB(t, recommended)
		s := ops(sqlitestore.New(db))
		l := bucket("n", "k", 9, 3)
		inTx(t, s, func(tx *sql.Tx) {
			require.True(t, take(t, s, tx, driver.TakeParams{Limit: l, Count: 7, Now: &now}).Decision.OK)
		})
		before := dump(t, db)
		require.Len(t, before, 3)
		later := now.Add(time.Second) // refills a little, not enough
		inTx(t, s, func(tx *sql.Tx) {
			res := take(t, s, tx, driver.TakeParams{Limit: l, Count: 3, Now: &later})
			require.False(t, res.Decision.OK)
			require.Positive(t, res.Decision.RetryAfter)
			require.Len(t, res.States, 3)
		})
		require.Equal(t, before, dump(t, db), "a denial writes nothing")
		inTx(t, s, func(tx *sql.Tx) {
			require.False(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", "new", 9, 3), Count: 10, Now: &now}).Decision.OK)
		})
		require.Equal(t, before, dump(t, db), "not even on a key with no row")
	})

	// A denial on a resharded key writes the reshard, which holds the same
	// total: the decision of the next call is the same.
	t.Run("denial-resharded", func(t *testing.T) {
		s := ops(sqlitestore.New(openDB(t, recommended)))
		inTx(t, s, func(tx *sql.Tx) {
			require.True(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", "k", 9, 1), Count: 7, Now: &now}).Decision.OK)
		})
		require.Equal(t, []driver.Row{rw(0, 2, now)}, readRows(t, s, "n", "k"))
		l := bucket("n", "k", 9, 3)
		var first driver.TakeResult
		inTx(t, s, func(tx *sql.Tx) {
			first = take(t, s, tx, driver.TakeParams{Limit: l, Count: 3, Now: &now})
			require.False(t, first.Decision.OK)
		})
		rows := readRows(t, s, "n", "k")
		require.Len(t, rows, 3)
		require.InDelta(t, 2.0, total(rows), 1e-12, "the total is kept")
		inTx(t, s, func(tx *sql.Tx) {
			again := take(t, s, tx, driver.TakeParams{Limit: l, Count: 3, Now: &now})
			require.Equal(t, first.Decision, again.Decision)
		})
		require.Equal(t, rows, readRows(t, s, "n", "k"), "a denial on rows already resharded writes nothing")
	})
}

// TestTakeAllCreditPrune covers the other operations of the store: TakeAll
// takes from every limit or from none, Credit gives back up to capacity and
// creates no row, Prune deletes the rows of the full keys of known names.
func TestTakeAllCreditPrune(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, recommended)
	s := ops(sqlitestore.New(db))
	now := time.UnixMicro(5_000_000)
	a, b := bucket("n", "a", 2, 1), bucket("n", "b", 3, 3)
	takeAll := func() driver.TakeAllResult {
		var res driver.TakeAllResult
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			var err error
			res, err = s.TakeAll(ctx, tx, driver.TakeAllParams{Now: &now, Takes: []driver.TakeParams{
				{Limit: b, Count: 2}, {Limit: a, Count: 1},
			}})
			return err
		}))
		return res
	}
	res := takeAll()
	require.True(t, res.OK)
	require.Equal(t, now, res.At)
	require.Equal(t, []driver.Row{rw(0, 1, now)}, readRows(t, s, "n", "a"))
	require.Equal(t, []driver.Row{rw(0, 1.0/3, now), rw(1, 1.0/3, now), rw(2, 1.0/3, now)}, readRows(t, s, "n", "b"))

	before := dump(t, db)
	res = takeAll() // b holds 1: denied, and a takes nothing either
	require.False(t, res.OK)
	require.False(t, res.Results[0].Decision.OK)
	require.True(t, res.Results[1].Decision.OK, "a alone would grant")
	require.Equal(t, before, dump(t, db), "all or none")

	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.Credit(ctx, tx, driver.CreditParams{Limit: a, Count: 5, Now: &now}))
		require.NoError(t, s.Credit(ctx, tx, driver.CreditParams{Limit: bucket("n", "absent", 2, 1), Count: 1, Now: &now}))
	})
	require.Equal(t, []driver.Row{rw(0, 2, now)}, readRows(t, s, "n", "a"), "credited up to capacity")
	require.Empty(t, readRows(t, s, "n", "absent"), "a key with no row is full already")

	_, err := db.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('x', 'k', 0, 1, 0)`)
	require.NoError(t, err)
	// Under n's config (a's: capacity 2, one shard), a is full again and b,
	// whose three shards pool into one, is not.
	limits := map[string]driver.LimitConfig{"n": {Config: a.Config, Shards: a.Shards}}
	got, err := s.Prune(ctx, driver.PruneParams{Max: 10, Now: &now, Limits: limits})
	require.NoError(t, err)
	require.Equal(t, driver.PruneResult{Keys: 3, Unknown: 1, Deleted: 1, Last: driver.KeyRef{Name: "x", Key: "k"}}, got)
	require.Empty(t, readRows(t, s, "n", "a"))
	require.Len(t, readRows(t, s, "n", "b"), 3)
	require.Len(t, readRows(t, s, "x", "k"), 1, "an unknown name is left alone")
	got, err = s.Prune(ctx, driver.PruneParams{After: got.Last, Max: 10, Now: &now, Limits: limits})
	require.NoError(t, err)
	require.Equal(t, driver.PruneResult{}, got, "nothing after the last key")
}

func TestInTx(t *testing.T) {
	ctx := context.Background()
	s := ops(sqlitestore.New(openDB(t, recommended)))
	count := func() (n int) {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			return tx.QueryRow(`SELECT count(*) FROM txlimit`).Scan(&n)
		}))
		return n
	}
	insert := func(tx *sql.Tx, key string) {
		require.True(t, take(t, s, tx, driver.TakeParams{Limit: bucket("n", key, 1, 1), Count: 1}).Decision.OK)
	}

	inTx(t, s, func(tx *sql.Tx) { insert(tx, "committed") })
	require.Equal(t, 1, count())

	boom := errors.New("boom")
	err := s.InTx(ctx, false, func(tx *sql.Tx) error { insert(tx, "error"); return boom })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, count(), "an error rolls back")

	require.PanicsWithValue(t, "panic", func() {
		_ = s.InTx(ctx, false, func(tx *sql.Tx) error { insert(tx, "panic"); panic("panic") })
	})
	require.Equal(t, 1, count(), "a panic rolls back")

	err = ops(sqlitestore.New(nil)).InTx(ctx, false, func(*sql.Tx) error { t.Fatal("fn called without a database"); return nil })
	require.ErrorIs(t, err, driver.ErrNoPool)
	require.ErrorIs(t, ops(sqlitestore.New(nil)).Ping(ctx), driver.ErrNoPool)
}

// TestNotMigrated: on a database where migrations.Up did not run (or the
// table lacks a column), Ping and every operation fail with an error that
// matches ErrNotMigrated and says what to run.
func TestNotMigrated(t *testing.T) {
	ctx := context.Background()
	requireNotMigrated := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, txlimit.ErrNotMigrated)
		require.ErrorContains(t, err, "migrations.Up")
	}
	check := func(t *testing.T, db *sql.DB) {
		s := ops(sqlitestore.New(db))
		requireNotMigrated(t, s.Ping(ctx))
		requireNotMigrated(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			_, err := s.Take(ctx, tx, driver.TakeParams{Limit: bucket("n", "k", 1, 1), Count: 1})
			return err
		}))
		requireNotMigrated(t, s.InTx(ctx, true, func(tx *sql.Tx) error {
			_, err := s.Read(ctx, tx, driver.ReadParams{Name: "n", Key: "k"})
			return err
		}))
	}
	t.Run("no-table", func(t *testing.T) {
		check(t, openBareDB(t, recommended))
	})
	t.Run("missing-column", func(t *testing.T) {
		db := openBareDB(t, recommended)
		_, err := db.ExecContext(ctx, `CREATE TABLE txlimit (name TEXT, key TEXT, shard INTEGER, value REAL)`)
		require.NoError(t, err)
		check(t, db)
	})
	t.Run("migrated", func(t *testing.T) {
		require.NoError(t, ops(sqlitestore.New(openDB(t, recommended))).Ping(ctx))
	})
}

// TestTakeTakesTheWriteLock verifies the claim Take rests on: in a deferred
// transaction, Take takes SQLite's write lock before it reads, even on a key
// with no row that it then denies and writes nothing to (TouchKey is an
// UPDATE that matches no row), so a second transaction cannot write (nor,
// through Take, read) until the first ends. Read takes no write lock.
func TestTakeTakesTheWriteLock(t *testing.T) {
	for _, mode := range []string{"wal", "delete"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			// Deferred transactions and no busy_timeout: contention fails
			// at once with SQLITE_BUSY instead of waiting.
			db := openDB(t, "_pragma=journal_mode("+mode+")")
			s := ops(sqlitestore.New(db))
			a, err := db.Conn(ctx)
			require.NoError(t, err)
			defer a.Close()
			b, err := db.Conn(ctx)
			require.NoError(t, err)
			defer b.Close()

			txA, err := a.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = txA.Rollback() }()

			// A deferred BEGIN and a Read take no write lock: B can write.
			read(t, s, txA, "n", "k", nil)
			if mode == "wal" {
				_, err = b.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('other', '', 0, 1, 0)`)
				require.NoError(t, err, "after Read, B can write")
				// A's snapshot is now stale; start over so that the next
				// step shows the lock, not the stale snapshot.
				require.NoError(t, txA.Rollback())
				txA, err = a.BeginTx(ctx, nil)
				require.NoError(t, err)
			}

			// A Take that denies, on a key with no row: nothing is written.
			res := take(t, s, txA, driver.TakeParams{Limit: bucket("n", "k", 1, 1), Count: 2})
			require.False(t, res.Decision.OK)
			require.Empty(t, read(t, s, txA, "n", "k", nil).Rows)
			// B cannot write anything, anywhere in the database...
			_, err = b.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('unrelated', '', 0, 1, 0)`)
			requireBusy(t, err)
			// ...nor take from the same key: the error says how to
			// configure the database.
			txB, err := b.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = s.Take(ctx, txB, driver.TakeParams{Limit: bucket("n", "k", 1, 1), Count: 1})
			requireBusyAdvice(t, err)
			require.NoError(t, txB.Rollback())

			// Once A ends, B can.
			require.NoError(t, txA.Rollback())
			_, err = b.ExecContext(ctx, `INSERT INTO txlimit (name, key, shard, value, ts) VALUES ('unrelated', '', 0, 1, 0)`)
			require.NoError(t, err)
		})
	}
}

// TestTakeWaitsAndReadsTheNewValue: with busy_timeout, the second Take
// waits for the first transaction to commit and then decides on what it
// wrote, never on the old value, even with a deferred BEGIN.
func TestTakeWaitsAndReadsTheNewValue(t *testing.T) {
	for _, params := range []string{
		recommended,
		"_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", // deferred BEGIN
	} {
		t.Run(params, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, params)
			s := ops(sqlitestore.New(db))
			now := time.UnixMicro(1_000_000)
			p := driver.TakeParams{Limit: bucket("n", "k", 10, 1), Count: 1, Now: &now}

			txA, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer txA.Rollback()
			res := take(t, s, txA, p)
			require.True(t, res.Decision.OK)
			require.Equal(t, 9.0, res.States[0].Value)

			type outcome struct {
				res driver.TakeResult
				err error
			}
			got := make(chan outcome, 1)
			go func() {
				txB, err := db.BeginTx(ctx, nil)
				if err != nil {
					got <- outcome{err: err}
					return
				}
				defer txB.Rollback()
				res, err := s.Take(ctx, txB, p)
				if err == nil {
					err = txB.Commit()
				}
				got <- outcome{res, err}
			}()
			select {
			case o := <-got:
				t.Fatalf("B decided (%+v, %v) while A held the write lock", o.res, o.err)
			case <-time.After(300 * time.Millisecond):
			}
			require.NoError(t, txA.Commit())
			select {
			case o := <-got:
				require.NoError(t, o.err)
				require.True(t, o.res.Decision.OK)
				require.Equal(t, 8.0, o.res.States[0].Value, "B decided on A's committed 9")
			case <-time.After(5 * time.Second):
				t.Fatal("B still waiting after A committed")
			}
			require.Equal(t, []driver.Row{rw(0, 8, now)}, readRows(t, s, "n", "k"))
		})
	}
}

// TestDeferredReadThenTakeIsAnError shows why the documentation asks for
// _txlock=immediate: a deferred transaction that read before Take cannot
// take the write lock once another connection has committed, busy_timeout
// or not. The failure is an error, never a decision on a stale value, and
// it comes at once: waiting cannot help, and SQLite does not wait. The
// busy_timeout is an hour, so that the error's coming at all shows it (a
// call that waited would hold the test until go test's -timeout ends it).
func TestDeferredReadThenTakeIsAnError(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, "_pragma=busy_timeout(3600000)&_pragma=journal_mode(WAL)")
	s := ops(sqlitestore.New(db))
	now := time.UnixMicro(1_000_000)
	p := driver.TakeParams{Limit: bucket("n", "k", 1, 1), Count: 1, Now: &now}

	txA, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer txA.Rollback()
	require.Empty(t, read(t, s, txA, "n", "k", nil).Rows) // A's snapshot starts here

	inTx(t, s, func(tx *sql.Tx) { require.True(t, take(t, s, tx, p).Decision.OK) })

	_, err = s.Take(ctx, txA, p)
	require.Error(t, err)
	require.Equal(t, sqliteBusySnapshot, sqliteCode(err), "want SQLITE_BUSY_SNAPSHOT, got %v", err)
	require.ErrorContains(t, err, "busy_timeout")
	require.ErrorContains(t, err, "_txlock=immediate")
	require.NoError(t, txA.Rollback())
	require.Equal(t, []driver.Row{rw(0, 0, now)}, readRows(t, s, "n", "k"), "only the committed Take took")
}

// TestReadOnlyTxDoesNotQueue: under _txlock=immediate a read-only
// transaction begins DEFERRED (modernc.org/sqlite), so CheckTx in it does
// not wait for the writer. The writer holds its lock until the read has
// returned: a read that queued behind it could only have ended in
// SQLITE_BUSY, after busy_timeout.
func TestReadOnlyTxDoesNotQueue(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, recommended)
	l, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"l": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, nil)
	require.NoError(t, err)

	txA, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer txA.Rollback()
	res, err := l.LimitTx(ctx, txA, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	ro, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	require.NoError(t, err)
	defer ro.Rollback()
	res, err = l.CheckTx(ctx, ro, "l", "k", txlimit.Count(10))
	require.NoError(t, err, "the read waited for the writer's lock")
	require.True(t, res.OK, "the uncommitted consumption is not visible")
}

func TestLimiterConcurrency(t *testing.T) {
	for _, shards := range []int{1, 4} {
		for _, perTx := range []int{1, 3} {
			t.Run(fmt.Sprintf("shards=%d/calls-per-tx=%d", shards, perTx), func(t *testing.T) {
				ok, denied, errs := hammer(t, recommended, shards, perTx)
				require.Empty(t, errs)
				require.Equal(t, 10, ok)
				require.Equal(t, 32*3-10, denied)
			})
		}
	}
}

// TestLimiterConcurrencyDeferred runs the same load with deferred
// transactions (no _txlock=immediate). The first statement of every Take,
// sharded or not, is the store's write (TouchKey), which waits for the
// write lock like BEGIN IMMEDIATE before anything is read: no transaction
// starts a snapshot it would then fail to upgrade, so there is no error
// and the count is exact.
func TestLimiterConcurrencyDeferred(t *testing.T) {
	for _, shards := range []int{1, 4} {
		for _, perTx := range []int{1, 3} {
			t.Run(fmt.Sprintf("shards=%d/calls-per-tx=%d", shards, perTx), func(t *testing.T) {
				ok, denied, errs := hammer(t, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", shards, perTx)
				require.Empty(t, errs)
				require.Equal(t, 10, ok)
				require.Equal(t, 32*3-10, denied)
			})
		}
	}
}

// hammer runs 32 goroutines that each make 3 LimitTx calls on one key of a
// token bucket of 10 per hour with a frozen clock, perTx calls per
// transaction, and counts the outcomes. It checks that the stored value
// agrees with the number admitted.
func hammer(t *testing.T, params string, shards, perTx int) (ok, denied int, errs []error) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t, params)
	db.SetMaxOpenConns(40)
	fixed := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"l": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour, Shards: shards},
	}, &txlimit.Options{Clock: func() time.Time { return fixed }})
	require.NoError(t, err)

	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			for range 3 / perTx {
				var admitted, refused int
				err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					for range perTx {
						res, err := l.LimitTx(ctx, tx, "l", "hot")
						if err != nil {
							return err
						}
						if res.OK {
							admitted++
						} else {
							refused++
						}
					}
					return tx.Commit()
				}()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ok += admitted
					denied += refused
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if perTx > 1 && len(errs) > 0 {
		t.Fatalf("errors with %d calls per transaction: %v", perTx, errs)
	}

	snap, err := l.Check(ctx, "l", "hot", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, float64(10-ok), snap.Remaining, 1e-9, "stored value agrees with the admissions")
	return ok, denied, errs
}

// row is one stored row, compared bit for bit.
type row struct {
	name, key         string
	shard             int64
	valueBits         uint64
	ts                int64
	valueType, tsType string
}

func dump(t *testing.T, db *sql.DB) []row {
	t.Helper()
	rs, err := db.Query(`SELECT name, key, shard, value, ts, typeof(value), typeof(ts) FROM txlimit ORDER BY name, key, shard`)
	require.NoError(t, err)
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var v float64
		require.NoError(t, rs.Scan(&r.name, &r.key, &r.shard, &v, &r.ts, &r.valueType, &r.tsType))
		r.valueBits = math.Float64bits(v)
		out = append(out, r)
	}
	require.NoError(t, rs.Err())
	return out
}

func TestRollbackLeavesRowsAsBefore(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, recommended)
	clock := time.UnixMicro(1_800_000_000_000_000)
	l, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"tb": {Kind: txlimit.TokenBucket, Rate: 3, Period: 7 * time.Second, Shards: 3},
		"fw": {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Minute},
	}, &txlimit.Options{Clock: func() time.Time { return clock }})
	require.NoError(t, err)

	for _, name := range []string{"tb", "fw"} {
		res, err := l.Limit(ctx, name, "k", txlimit.Count(2))
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	clock = clock.Add(1234567 * time.Microsecond)
	before := dump(t, db)
	require.Len(t, before, 4)

	for _, op := range []func(tx *sql.Tx) error{
		func(tx *sql.Tx) error { _, err := l.LimitTx(ctx, tx, "tb", "k"); return err },
		func(tx *sql.Tx) error {
			_, err := l.LimitTx(ctx, tx, "fw", "k", txlimit.Count(9), txlimit.Reserve())
			return err
		},
		func(tx *sql.Tx) error { _, err := l.LimitTx(ctx, tx, "tb", "new"); return err },
		func(tx *sql.Tx) error { return l.CreditTx(ctx, tx, "tb", "k", 1) },
		func(tx *sql.Tx) error { return l.ResetTx(ctx, tx, "fw", "k") },
	} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, op(tx))
		require.NoError(t, tx.Rollback())
		require.Equal(t, before, dump(t, db))
	}
}

// ops is the operations of s, which these tests call directly.
func ops(s *sqlitestore.Store) driver.Ops[*sql.Tx] { return driver.OpsOf[*sql.Tx](s) }
