package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sqlite "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
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
	dsn := "file:" + filepath.Join(t.TempDir(), "txlimit.db")
	if params != "" {
		dsn += "?" + params
	}
	db, err := sql.Open("sqlite", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
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

// inTx runs fn in a transaction of store and fails the test on error.
func inTx(t *testing.T, s *sqlitestore.Store, fn func(tx *sql.Tx)) {
	t.Helper()
	require.NoError(t, s.InTx(context.Background(), false, func(tx *sql.Tx) error { fn(tx); return nil }))
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	now := time.UnixMicro(1_700_000_000_123_456)
	ts := time.UnixMicro(1_699_999_999_000_001)

	inTx(t, s, func(tx *sql.Tx) {
		rows, at, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k", Now: &now})
		require.NoError(t, err)
		require.Empty(t, rows)
		require.True(t, at.Equal(now), "the clock is returned without rows")

		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 3, Value: 2.5, TS: ts}))
		rows, at, err = s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k", Now: &now})
		require.NoError(t, err)
		require.True(t, at.Equal(now))
		require.Len(t, rows, 3)
		for i, r := range rows {
			require.Equal(t, int32(i), r.Shard)
			require.Equal(t, 2.5, r.Value)
			require.True(t, r.TS.Equal(ts), "ts %v, want %v", r.TS, ts)
		}

		// Values that are not short decimals, negative values, and a ts
		// with nanoseconds, which is stored at microsecond precision.
		w := []txlimit.ShardWrite{
			{Name: "n", Key: "k", Shard: 0, Value: 1.0 / 3, TS: time.Unix(1_700_000_001, 999_999_999)},
			{Name: "n", Key: "k", Shard: 1, Value: -7.25e-9, TS: time.UnixMicro(-1)},
			{Name: "n", Key: "k", Shard: 2, Value: math.MaxFloat64, TS: time.UnixMicro(math.MaxInt64)},
		}
		require.NoError(t, s.WriteShards(ctx, tx, w))
	})

	inTx(t, s, func(tx *sql.Tx) {
		rows, _, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k", Now: &now})
		require.NoError(t, err)
		require.Equal(t, []txlimit.ShardRow{
			{Shard: 0, Value: 1.0 / 3, TS: time.UnixMicro(1_700_000_001_999_999)},
			{Shard: 1, Value: -7.25e-9, TS: time.UnixMicro(-1)},
			{Shard: 2, Value: math.MaxFloat64, TS: time.UnixMicro(math.MaxInt64)},
		}, rows)
	})

	// ts is INTEGER microseconds and value REAL, as the migration says.
	var tsType, valueType string
	var tsRaw int64
	require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
		return tx.QueryRow(`SELECT typeof(ts), typeof(value), ts FROM txlimit WHERE shard = 0`).Scan(&tsType, &valueType, &tsRaw)
	}))
	require.Equal(t, "integer", tsType)
	require.Equal(t, "real", valueType)
	require.Equal(t, int64(1_700_000_001_999_999), tsRaw)
}

func TestInsertShardsKeepsExistingRows(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	t0, t1 := time.UnixMicro(1_000_000), time.UnixMicro(2_000_000)
	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 2, Value: 5, TS: t0}))
		require.NoError(t, s.WriteShards(ctx, tx, []txlimit.ShardWrite{{Name: "n", Key: "k", Shard: 0, Value: -1, TS: t1}}))
	})
	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 4, Value: 9, TS: t1}))
		rows, _, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
		require.NoError(t, err)
		require.Equal(t, []txlimit.ShardRow{
			{Shard: 0, Value: -1, TS: t1},
			{Shard: 1, Value: 5, TS: t0},
			{Shard: 2, Value: 9, TS: t1},
			{Shard: 3, Value: 9, TS: t1},
		}, rows)
	})
}

func TestDeleteKey(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	ts := time.UnixMicro(1)
	inTx(t, s, func(tx *sql.Tx) {
		for _, nk := range [][2]string{{"n", "k"}, {"n", "other"}, {"m", "k"}, {"n", ""}} {
			require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: nk[0], Key: nk[1], Shards: 2, Value: 1, TS: ts}))
		}
	})
	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.DeleteKey(ctx, tx, "n", "k"))
		require.NoError(t, s.DeleteKey(ctx, tx, "absent", "k"))
	})
	inTx(t, s, func(tx *sql.Tx) {
		for nk, want := range map[[2]string]int{{"n", "k"}: 0, {"n", "other"}: 2, {"m", "k"}: 2, {"n", ""}: 2} {
			rows, _, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: nk[0], Key: nk[1]})
			require.NoError(t, err)
			require.Len(t, rows, want, "%q", nk)
		}
	})
}

func TestClock(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	injected := time.Date(2030, 1, 2, 3, 4, 5, 6_007_008, time.UTC)
	inTx(t, s, func(tx *sql.Tx) {
		rows, at, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k", Now: &injected})
		require.NoError(t, err)
		require.Empty(t, rows)
		require.True(t, at.Equal(injected.Truncate(time.Microsecond)), "ReadShards returns the injected clock, got %v", at)

		before := time.Now().Truncate(time.Microsecond)
		_, at, err = s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
		require.NoError(t, err)
		_, at2, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
		require.NoError(t, err)
		after := time.Now()
		for _, a := range []time.Time{at, at2} {
			require.False(t, a.Before(before) || a.After(after), "process clock %v not in [%v, %v]", a, before, after)
			require.Zero(t, a.Nanosecond()%1000, "clock at microsecond precision")
		}
	})
}

func TestTryLockShard(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	require.False(t, s.SkipsLocked())
	now := time.UnixMicro(42)
	inTx(t, s, func(tx *sql.Tx) {
		tried, err := s.TryLockShard(ctx, tx, txlimit.TryLockParams{Name: "n", Key: "k", Start: 1, Now: &now})
		require.NoError(t, err)
		require.False(t, tried.Locked, "no row exists")
		require.Empty(t, tried.All)
		require.True(t, tried.Now.Equal(now))

		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 3, Value: 1, TS: now}))
		tried, err = s.TryLockShard(ctx, tx, txlimit.TryLockParams{Name: "n", Key: "k", Start: 2, Now: &now})
		require.NoError(t, err)
		require.True(t, tried.Locked)
		require.Equal(t, int32(2), tried.Row.Shard, "the row at Start")
		require.Len(t, tried.All, 3, "every row of the key is read")
		require.NoError(t, s.KeepTry(ctx, tx, []txlimit.ShardWrite{{Name: "n", Key: "k", Shard: 2, Value: 0.5, TS: now}}))

		tried, err = s.TryLockShard(ctx, tx, txlimit.TryLockParams{Name: "n", Key: "k", Start: 7, Now: &now})
		require.NoError(t, err)
		require.True(t, tried.Locked)
		require.Equal(t, int32(0), tried.Row.Shard, "past the last row, the first")
		require.Equal(t, 0.5, tried.All[2].Value, "the transaction's own write is read")
		require.NoError(t, s.UndoTry(ctx, tx))

		waited, err := s.WaitShard(ctx, tx, txlimit.WaitShardParams{Name: "n", Key: "k", Shard: 1, Now: &now})
		require.NoError(t, err)
		require.True(t, waited.Locked)
		require.Equal(t, int32(1), waited.Row.Shard)
		waited, err = s.WaitShard(ctx, tx, txlimit.WaitShardParams{Name: "n", Key: "k", Shard: 5, Now: &now})
		require.NoError(t, err)
		require.False(t, waited.Locked, "no such row")
		require.NoError(t, s.UndoTry(ctx, tx))
	})
	inTx(t, s, func(tx *sql.Tx) {
		rows, _, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
		require.NoError(t, err)
		require.Equal(t, []float64{1, 1, 0.5}, []float64{rows[0].Value, rows[1].Value, rows[2].Value})
	})
}

func TestInTx(t *testing.T) {
	ctx := context.Background()
	s := sqlitestore.New(openDB(t, recommended))
	count := func() (n int) {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			return tx.QueryRow(`SELECT count(*) FROM txlimit`).Scan(&n)
		}))
		return n
	}
	insert := func(tx *sql.Tx, key string) {
		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: key, Shards: 1, Value: 1, TS: time.UnixMicro(0)}))
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

	err = sqlitestore.New(nil).InTx(ctx, false, func(*sql.Tx) error { t.Fatal("fn called without a database"); return nil })
	require.ErrorIs(t, err, txlimit.ErrNoPool)
}

// TestTouchKeyTakesTheWriteLock verifies the claim LockShards rests on: in a
// deferred transaction, an UPDATE that matches no row takes SQLite's write
// lock all the same, so a second transaction cannot write (nor, through
// LockShards, read) until the first ends.
func TestTouchKeyTakesTheWriteLock(t *testing.T) {
	for _, mode := range []string{"wal", "delete"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			// Deferred transactions and no busy_timeout: contention fails
			// at once with SQLITE_BUSY instead of waiting.
			db := openDB(t, "_pragma=journal_mode("+mode+")")
			s := sqlitestore.New(db)
			a, err := db.Conn(ctx)
			require.NoError(t, err)
			defer a.Close()
			b, err := db.Conn(ctx)
			require.NoError(t, err)
			defer b.Close()

			txA, err := a.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = txA.Rollback() }()

			// A deferred BEGIN and a read take no write lock: B can write.
			_, _, err = s.ReadShards(ctx, txA, txlimit.KeyParams{Name: "n", Key: "k"})
			require.NoError(t, err)
			if mode == "wal" {
				_, err = b.ExecContext(ctx, `INSERT INTO txlimit VALUES ('other', '', 0, 1, 0)`)
				require.NoError(t, err, "before LockShards, B can write")
				// A's snapshot is now stale; start over so that the next
				// step shows the lock, not the stale snapshot.
				require.NoError(t, txA.Rollback())
				txA, err = a.BeginTx(ctx, nil)
				require.NoError(t, err)
			}

			// LockShards on a key with no row: TouchKey changes nothing.
			rows, _, err := s.LockShards(ctx, txA, txlimit.KeyParams{Name: "n", Key: "k"})
			require.NoError(t, err)
			require.Empty(t, rows)
			// B cannot write anything, anywhere in the database...
			_, err = b.ExecContext(ctx, `INSERT INTO txlimit VALUES ('unrelated', '', 0, 1, 0)`)
			requireBusy(t, err)
			// ...nor take the rows of the same key with LockShards.
			txB, err := b.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, _, err = s.LockShards(ctx, txB, txlimit.KeyParams{Name: "n", Key: "k"})
			requireBusy(t, err)
			require.NoError(t, txB.Rollback())

			// Once A ends, B can.
			require.NoError(t, txA.Rollback())
			_, err = b.ExecContext(ctx, `INSERT INTO txlimit VALUES ('unrelated', '', 0, 1, 0)`)
			require.NoError(t, err)
		})
	}
}

// TestLockShardsWaitsAndReadsTheNewValue: with busy_timeout, the second
// LockShards waits for the first transaction to commit and then reads what
// it wrote, never the old value.
func TestLockShardsWaitsAndReadsTheNewValue(t *testing.T) {
	for _, params := range []string{
		recommended,
		"_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", // deferred BEGIN
	} {
		t.Run(params, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, params)
			s := sqlitestore.New(db)
			p := txlimit.KeyParams{Name: "n", Key: "k"}
			inTx(t, s, func(tx *sql.Tx) {
				require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 1, Value: 10, TS: time.UnixMicro(0)}))
			})

			txA, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer txA.Rollback()
			rows, _, err := s.LockShards(ctx, txA, p)
			require.NoError(t, err)
			require.Equal(t, 10.0, rows[0].Value)

			got := make(chan float64, 1)
			go func() {
				txB, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					got <- math.NaN()
					return
				}
				defer txB.Rollback()
				rows, _, err := s.LockShards(ctx, txB, p)
				if err != nil {
					t.Error(err)
					got <- math.NaN()
					return
				}
				got <- rows[0].Value
			}()
			select {
			case v := <-got:
				t.Fatalf("B read %v while A held the rows", v)
			case <-time.After(300 * time.Millisecond):
			}
			require.NoError(t, s.WriteShards(ctx, txA, []txlimit.ShardWrite{{Name: "n", Key: "k", Value: 9, TS: time.UnixMicro(1)}}))
			require.NoError(t, txA.Commit())
			select {
			case v := <-got:
				require.Equal(t, 9.0, v, "B reads A's committed value")
			case <-time.After(5 * time.Second):
				t.Fatal("B still waiting after A committed")
			}
		})
	}
}

// TestDeferredReadThenLockIsAnError shows why the documentation asks for
// _txlock=immediate: a deferred transaction that read before LockShards
// cannot take the write lock once another connection has committed, busy_timeout
// or not. The failure is an error, never a decision on a stale value.
func TestDeferredReadThenLockIsAnError(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	s := sqlitestore.New(db)
	p := txlimit.KeyParams{Name: "n", Key: "k"}

	txA, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer txA.Rollback()
	_, _, err = s.ReadShards(ctx, txA, p) // A's snapshot starts here
	require.NoError(t, err)

	inTx(t, s, func(tx *sql.Tx) {
		require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 1, Value: 1, TS: time.UnixMicro(0)}))
	})

	start := time.Now()
	_, _, err = s.LockShards(ctx, txA, p)
	require.Error(t, err)
	require.Equal(t, sqliteBusySnapshot, sqliteCode(err), "want SQLITE_BUSY_SNAPSHOT, got %v", err)
	require.Less(t, time.Since(start), time.Second, "fails at once: waiting cannot help")
}

// TestReadOnlyTxDoesNotQueue: under _txlock=immediate a read-only
// transaction begins DEFERRED (modernc.org/sqlite), so CheckTx and ValueTx
// in it do not wait for the writer.
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

	start := time.Now()
	ro, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	require.NoError(t, err)
	defer ro.Rollback()
	res, err = l.CheckTx(ctx, ro, "l", "k", txlimit.Count(10))
	require.NoError(t, err)
	require.True(t, res.OK, "the uncommitted consumption is not visible")
	require.Less(t, time.Since(start), time.Second)
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
// transactions (no _txlock=immediate). An unsharded limit's first statement
// is the store's write, which waits like BEGIN IMMEDIATE; a sharded one reads
// first and may fail with SQLITE_BUSY_SNAPSHOT. Either way nothing is
// admitted that should not be.
func TestLimiterConcurrencyDeferred(t *testing.T) {
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ok, denied, errs := hammer(t, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)", shards, 1)
			t.Logf("admitted %d, denied %d, errors %d", ok, denied, len(errs))
			for _, err := range errs {
				require.Equal(t, sqliteBusy, sqliteCode(err)&0xff, "only SQLITE_BUSY*: %v", err)
			}
			require.LessOrEqual(t, ok, 10)
			require.Equal(t, 32*3, ok+denied+len(errs))
			if shards == 1 {
				require.Empty(t, errs)
				require.Equal(t, 10, ok)
			}
		})
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

	snap, err := l.Value(ctx, "l", "hot")
	require.NoError(t, err)
	require.InDelta(t, float64(10-ok), snap.Value, 1e-9, "stored value agrees with the admissions")
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
