package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/mysqlstore"
)

// The tests in this file open up to 101 connections each, so they do not
// run in parallel with each other or with the suite (max_connections is 151
// by default).

// createOrders creates the business table the ledger tests write beside
// the limit.
func createOrders(t *testing.T, db *sql.DB) {
	t.Helper()
	_, err := db.Exec("CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(300) NOT NULL, k VARCHAR(100) NOT NULL)")
	require.NoError(t, err)
}

func countOrders(t *testing.T, db *sql.DB, name string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM orders WHERE name = ?", name).Scan(&n))
	return n
}

// 32 connections call one limit at once, each in a business transaction
// that inserts an order and commits only when the limit admits: exactly
// Capacity calls are admitted, exactly Capacity orders exist, none of the
// calls fails (a deadlock or lock wait timeout would), on a frozen clock and
// on the server's, unsharded and sharded.
func TestConcurrentCallsAdmitExactly32(t *testing.T) {
	const workers, callsEach, capacity = 32, 4, 40
	ctx := context.Background()
	db := mysqltest.Database(t, workers+1)
	createOrders(t, db)
	for _, tc := range []struct {
		kind   txlimit.Kind
		shards int
		frozen bool
	}{
		{txlimit.TokenBucket, 1, true}, {txlimit.FixedWindow, 1, true},
		{txlimit.TokenBucket, 4, true}, {txlimit.FixedWindow, 8, true},
		{txlimit.TokenBucket, 1, false}, {txlimit.TokenBucket, 4, false},
	} {
		t.Run(fmt.Sprintf("%v/shards=%d/frozen=%v", storetest.KindName(tc.kind), tc.shards, tc.frozen), func(t *testing.T) {
			name := t.Name()
			var opts *txlimit.Options
			if tc.frozen {
				at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
				opts = &txlimit.Options{Clock: func() time.Time { return at }}
			}
			// On the server's clock a token comes back every 90 s: none
			// during the test.
			l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{name: {
				Kind: tc.kind, Rate: capacity, Period: time.Hour, Shards: tc.shards,
			}}, opts)
			require.NoError(t, err)
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers*callsEach)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range callsEach {
						err := func() error {
							tx, err := db.BeginTx(ctx, nil)
							if err != nil {
								return err
							}
							defer func() { _ = tx.Rollback() }()
							if _, err := tx.ExecContext(ctx, "INSERT INTO orders (name, k) VALUES (?, 'hot')", name); err != nil {
								return err
							}
							res, err := l.LimitTx(ctx, tx, name, "hot")
							if err != nil {
								return err
							}
							if !res.OK {
								denied.Add(1)
								return nil // the rollback drops the order
							}
							admitted.Add(1)
							return tx.Commit()
						}()
						if err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, capacity, admitted.Load())
			require.EqualValues(t, workers*callsEach-capacity, denied.Load())
			require.Equal(t, capacity, countOrders(t, db, name))
			snap, err := l.Check(ctx, name, "hot", txlimit.Count(0))
			require.NoError(t, err)
			require.InDelta(t, 0, snap.Remaining, 0.05)
		})
	}
}

// The first use of 100 new keys at once, in keys that sort next to each
// other (so that their rows would fall into one gap of the index), sees no
// deadlock and no lock wait timeout: the store creates rows with INSERT …
// ON DUPLICATE KEY UPDATE, which takes no gap lock. The control, the
// pattern the peers shipped (SELECT … FOR UPDATE on the missing row,
// then INSERT), deadlocks on the same keys.
func TestNewKeysConcurrently(t *testing.T) {
	const keys = 100
	ctx := context.Background()
	db := mysqltest.Database(t, keys+1)
	var seq atomic.Int64

	// start runs fn(i) for i in 0..keys-1 at once, each in a transaction of
	// its own that it commits, and returns the errors.
	start := func(fn func(tx *sql.Tx, i int, ready func()) error) []error {
		var wg sync.WaitGroup
		var barrier sync.WaitGroup
		barrier.Add(keys)
		errs := make([]error, keys)
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				once := sync.OnceFunc(func() { barrier.Done(); barrier.Wait() })
				defer once() // a failure before ready must not hold the others
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					errs[i] = err
					return
				}
				defer func() { _ = tx.Rollback() }()
				if err := fn(tx, i, once); err != nil {
					errs[i] = err
					return
				}
				errs[i] = tx.Commit()
			}()
		}
		wg.Wait()
		return errs
	}

	for _, tc := range []struct {
		desc string
		call func(l *txlimit.Limiter[*sql.Tx], tx *sql.Tx, name string, i int) error
	}{
		{"LimitTx", func(l *txlimit.Limiter[*sql.Tx], tx *sql.Tx, name string, i int) error {
			res, err := l.LimitTx(ctx, tx, name, fmt.Sprintf("k%03d", i))
			if err == nil && !res.OK {
				err = errors.New("a new key was denied")
			}
			return err
		}},
		{"LimitTx sharded", func(l *txlimit.Limiter[*sql.Tx], tx *sql.Tx, name string, i int) error {
			res, err := l.LimitTx(ctx, tx, name, fmt.Sprintf("k%03d", i),
				txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 8, Period: time.Minute, Shards: 4}))
			if err == nil && !res.OK {
				err = errors.New("a new key was denied")
			}
			return err
		}},
		{"LimitAll of two new keys, each shared with a neighbour", func(l *txlimit.Limiter[*sql.Tx], tx *sql.Tx, name string, i int) error {
			res, err := l.LimitAllTx(ctx, tx, req(name, fmt.Sprintf("k%03d", (i+1)%keys)), req(name, fmt.Sprintf("k%03d", i)))
			if err == nil && !res.OK {
				err = errors.New("two new keys were denied")
			}
			return err
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			name := fmt.Sprintf("new-keys-%d", seq.Add(1))
			l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Minute},
			}, nil)
			require.NoError(t, err)
			errs := start(func(tx *sql.Tx, i int, ready func()) error {
				ready()
				return tc.call(l, tx, name, i)
			})
			for i, err := range errs {
				require.NoError(t, err, "key %d", i)
			}
			var rows int
			require.NoError(t, db.QueryRow("SELECT COUNT(DISTINCT `key`) FROM txlimit WHERE name = ?", name).Scan(&rows))
			require.Equal(t, keys, rows)
		})
	}

	t.Run("control: SELECT FOR UPDATE then INSERT deadlocks", func(t *testing.T) {
		_, err := db.Exec("CREATE TABLE naive (k VARCHAR(20) PRIMARY KEY, v DOUBLE NOT NULL)")
		require.NoError(t, err)
		_, err = db.Exec("INSERT INTO naive VALUES ('a', 0), ('z', 0)") // every new key falls into one gap
		require.NoError(t, err)
		errs := start(func(tx *sql.Tx, i int, ready func()) error {
			k := fmt.Sprintf("k%03d", i)
			var v float64
			err := tx.QueryRowContext(ctx, "SELECT v FROM naive WHERE k = ? FOR UPDATE", k).Scan(&v)
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("want no row, got %w", err)
			}
			ready() // every transaction now holds the gap
			_, err = tx.ExecContext(ctx, "INSERT INTO naive VALUES (?, 1)", k)
			return err
		})
		deadlocks := 0
		for _, err := range errs {
			var myErr *mysql.MySQLError
			if errors.As(err, &myErr) && myErr.Number == 1213 {
				deadlocks++
			}
		}
		require.Positive(t, deadlocks, "the peers' pattern deadlocks where the store does not: %v", errs)
		t.Logf("the peers' pattern: %d of %d first uses deadlocked", deadlocks, keys)
	})
}

// LimitAll locks in one canonical order, the keys compared as bytes,
// whatever the order the caller lists them in and whatever the connection's
// collation says: "B" (0x42) comes before "a" (0x61) as bytes and after it
// in utf8mb4_general_ci. Callers that list them in opposite orders and hold
// the locks a while never deadlock, and admit exactly.
func TestLimitAllLocksInOneOrder(t *testing.T) {
	const workers, callsEach, capacity = 16, 6, 30
	ctx := context.Background()
	db := mysqltest.Database(t, workers+1)
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
		"all": {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour},
		"ALL": {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: 3},
	}, nil)
	require.NoError(t, err)
	reqs := [][]txlimit.Request{
		{req("all", "a"), req("all", "B"), req("ALL", "é")},
		{req("ALL", "é"), req("all", "B"), req("all", "a")},
		{req("all", "B"), req("ALL", "é"), req("all", "a")},
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*callsEach)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range callsEach {
				err := mysqlstore.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
					res, err := l.LimitAllTx(ctx, tx, reqs[w%len(reqs)]...)
					if err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // hold the locks
					if res.OK {
						admitted.Add(1)
					}
					return nil
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, capacity, admitted.Load())
}

// Prune never waits for a row that live traffic holds: with a transaction
// holding one key's row, a batch deletes the other idle keys and returns,
// leaving the held key for a later run. "Never waits" is observed, not
// timed: while the batch runs, InnoDB shows no transaction of the test's
// database in LOCK WAIT (lockWaits), a probe first shown to see a plain
// locking read of the same row wait.
func TestPruneDoesNotWait(t *testing.T) {
	ctx := context.Background()
	db := mysqltest.Database(t, 4)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
		"idle": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Shards: 2},
	}, &txlimit.Options{Clock: clock})
	require.NoError(t, err)
	for i := range 5 {
		_, err := l.Limit(ctx, "idle", fmt.Sprint("k", i))
		require.NoError(t, err)
	}
	mu.Lock()
	at = at.Add(time.Hour) // every key full again
	mu.Unlock()
	const lockHeld = "SELECT value FROM txlimit WHERE name = 'idle' AND `key` = 'k2' AND shard = 1 FOR UPDATE"
	held, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer held.Rollback()
	_, err = held.ExecContext(ctx, lockHeld)
	require.NoError(t, err)

	// InnoDB refreshes what information_schema.INNODB_TRX shows only once
	// nobody has read it for 100 ms: the probe reads it every 150.
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	probe := func() int { <-tick.C; return lockWaits(t, db) }

	// The control: a locking read of the held row waits, and the probe sees
	// it, until its own innodb_lock_wait_timeout (1 s) ends it with 1205.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1")
	require.NoError(t, err)
	control := make(chan error, 1)
	go func() { _, err := conn.ExecContext(ctx, lockHeld); control <- err }()
	for probe() == 0 {
		select {
		case err := <-control:
			t.Fatalf("the probe never saw the control wait for the held row (it ended with %v)", err)
		default:
		}
	}
	var myErr *mysql.MySQLError
	require.ErrorAs(t, <-control, &myErr)
	require.EqualValues(t, 1205, myErr.Number, "the control waited for the held row until its timeout")
	_, err = conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT")
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	require.Zero(t, probe(), "the control's wait is over")

	type pruned struct {
		res txlimit.PruneResult
		err error
	}
	done := make(chan pruned, 1)
	go func() { res, err := l.Prune(ctx, nil); done <- pruned{res, err} }()
	var p pruned
	for waiting := true; waiting; {
		select {
		case p = <-done:
			waiting = false
		case <-tick.C:
			if lockWaits(t, db) > 0 {
				_ = held.Rollback() // let the batch end
				<-done
				t.Fatal("Prune waited for the held row")
			}
		}
	}
	require.NoError(t, p.err)
	require.Equal(t, 8, p.res.Deleted, "four idle keys of two rows; the held one is left")
	var left int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM txlimit WHERE name = 'idle'").Scan(&left))
	require.Equal(t, 2, left)
	require.NoError(t, held.Rollback())
	res, err := l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 2, res.Deleted, "a later run deletes it")
}

// lockWaits counts the transactions of db's database that wait for a row
// lock, as InnoDB shows them (information_schema, on MySQL and MariaDB).
func lockWaits(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.INNODB_TRX AS x
		JOIN information_schema.PROCESSLIST AS p ON p.ID = x.trx_mysql_thread_id
		WHERE x.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&n))
	return n
}
