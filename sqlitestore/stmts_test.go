package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

func openTestDB(t *testing.T) *sql.DB {
	return openTestDBMode(t, "WAL")
}

func openTestDBMode(t *testing.T, mode string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode("+mode+")&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

// frozen is the clock of these tests: with it and the limit of takeOne,
// nothing refills between calls.
var frozen = time.UnixMicro(1_700_000_000_000_000)

// takeOne takes one token, as a reservation so that it always grants and
// writes, from an unsharded token bucket of capacity 1000 on (name, key).
// Take runs one statement, TakeRow, on a key with its row or without. It
// returns the value left.
func takeOne(ctx context.Context, s *backend, tx *sql.Tx, name, key string) (float64, error) {
	res, err := s.Take(ctx, tx, driver.TakeParams{
		Limit: driver.Limit{Name: name, Key: key, Shards: 1, Config: algo.Config{
			Kind: algo.TokenBucket, Rate: 1, Period: time.Hour.Microseconds(), Capacity: 1000,
		}},
		Count: 1, Reserve: true, Now: &frozen,
	})
	if err != nil {
		return 0, err
	}
	if !res.Decision.OK || len(res.States) != 1 {
		return 0, fmt.Errorf("Take: %+v, want a grant with one state", res)
	}
	return res.States[0].Value, nil
}

// readRows reads (name, key) with Read in a read-only transaction of s.
func readRows(t *testing.T, s *backend, name, key string) []driver.Row {
	t.Helper()
	var rows []driver.Row
	require.NoError(t, s.InTx(context.Background(), true, func(tx *sql.Tx) error {
		r, err := s.Read(context.Background(), tx, driver.ReadParams{Name: name, Key: key})
		rows = r.Rows
		return err
	}))
	return rows
}

// prepared returns the names (sqlc's "-- name: X") of the statements the
// store has prepared.
func prepared(s *backend) map[string]bool {
	out := map[string]bool{}
	s.stmts.ready.Range(func(q, _ any) bool {
		name, _, _ := strings.Cut(strings.TrimPrefix(q.(string), "-- name: "), " ")
		out[name] = true
		return true
	})
	return out
}

// everyStatement is what a granted Take (on a new key and on an existing
// one) and Read run.
var everyStatement = []string{"TakeRow", "ReadShards"}

// prepareAll runs Takes (creating a key, then writing it) and a Read until
// the store has prepared their statements in the background.
func prepareAll(t *testing.T, s *backend) {
	t.Helper()
	ctx := context.Background()
	i := 0
	ready := func() bool {
		i++
		key := "up"
		if i%2 == 0 {
			key = time.Duration(i).String() // a new key
		}
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			_, err := takeOne(ctx, s, tx, "warm", key)
			return err
		}))
		readRows(t, s, "warm", "up")
		p := prepared(s)
		for _, name := range everyStatement {
			if !p[name] {
				return false
			}
		}
		return true
	}
	require.Eventually(t, ready, 10*time.Second, time.Millisecond)
}

// A Store's prepared statements belong to its *sql.DB; a transaction of
// another DB still works, on its own DB, with the SQL text.
func TestTxOfAnotherDB(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDB(t))
	prepareAll(t, s)

	other := openTestDB(t)
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, want := range []float64{999, 998} { // a new row, then an update
		v, err := takeOne(ctx, s, tx, "n", "k")
		require.NoError(t, err)
		require.Equal(t, want, v)
	}
	r, err := s.Read(ctx, tx, driver.ReadParams{Name: "n", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, []driver.Row{{Shard: 0, Value: 998, TS: frozen}}, r.Rows, "the transaction reads its own writes")
	require.NoError(t, tx.Commit())

	var n int
	require.NoError(t, other.QueryRow(`SELECT count(*) FROM txlimit WHERE name = 'n'`).Scan(&n))
	require.Equal(t, 1, n, "the row is in the transaction's DB")
	require.NoError(t, s.db.QueryRow(`SELECT count(*) FROM txlimit WHERE name = 'n'`).Scan(&n))
	require.Equal(t, 0, n, "and not in the store's")
	require.Empty(t, readRows(t, s, "n", "k"))
}

// With a pool of one connection, the transaction holds the only connection:
// preparing must not wait for it inside the call. Every call completes,
// prepared or not, and the limit counts exactly.
func TestOneConnectionPool(t *testing.T) {
	db := openTestDB(t)
	db.SetMaxOpenConns(1)
	store := New(db)
	l, err := txlimit.New(store, map[string]txlimit.Config{
		"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 5},
	}, &txlimit.Options{Clock: func() time.Time { return frozen }})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	take := func(key string) bool {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err := l.LimitTx(ctx, tx, "l", key)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return res.OK
	}
	granted := 0
	for range 8 {
		if take("a") {
			granted++
		}
	}
	require.Equal(t, 5, granted, "before and while the statements are prepared")

	// The prepares get the connection between transactions; from then on
	// the calls run prepared, on the one connection, and still count
	// exactly.
	ready := func() bool {
		p := prepared(driver.OpsOf[*sql.Tx](store).(*backend))
		// TakeRow grants; a denial reads the row with TouchKey and
		// LockShards.
		return p["TakeRow"] && p["TouchKey"] && p["LockShards"]
	}
	require.Eventually(t, ready, 10*time.Second, time.Millisecond)
	granted = 0
	for range 8 {
		if take("b") {
			granted++
		}
	}
	require.Equal(t, 5, granted, "prepared")
}

// Once the statements are ready, the calls run them and read and write
// what the text would.
func TestPreparedStatements(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDB(t))
	prepareAll(t, s)
	before := readRows(t, s, "warm", "up")
	require.Len(t, before, 1)

	for i := range 3 {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			v, err := takeOne(ctx, s, tx, "warm", "up")
			require.Equal(t, before[0].Value-float64(i+1), v, "TakeRow read the value it wrote before")
			return err
		}))
		require.Equal(t, []driver.Row{{Shard: 0, Value: before[0].Value - float64(i+1), TS: frozen}},
			readRows(t, s, "warm", "up"))
	}
	// A new key, prepared.
	require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
		_, err := takeOne(ctx, s, tx, "warm", "new")
		return err
	}))
	require.Equal(t, []driver.Row{{Shard: 0, Value: 999, TS: frozen}}, readRows(t, s, "warm", "new"))
	require.ElementsMatch(t, everyStatement, keys(prepared(s)), "nothing else is prepared")
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// In rollback-journal mode a connection the pool opened to prepare could
// make another's COMMIT fail: the store learns the mode and prepares
// nothing.
func TestRollbackJournalPreparesNothing(t *testing.T) {
	ctx := context.Background()
	s := newBackend(openTestDBMode(t, "delete"))
	for range 20 {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			_, err := takeOne(ctx, s, tx, "n", "k")
			return err
		}))
		readRows(t, s, "n", "k")
	}
	require.Equal(t, modeOther, s.stmts.mode.Load())
	s.stmts.pending.Range(func(q, _ any) bool { t.Errorf("preparing %q", q); return true })
	s.stmts.ready.Range(func(q, _ any) bool { t.Errorf("prepared %q", q); return true })
	require.Equal(t, []driver.Row{{Shard: 0, Value: 980, TS: frozen}}, readRows(t, s, "n", "k"))
}

// newBackend is the operations of New(db), which the tests of this package
// call directly.
func newBackend(db *sql.DB) *backend { return driver.OpsOf[*sql.Tx](New(db)).(*backend) }
