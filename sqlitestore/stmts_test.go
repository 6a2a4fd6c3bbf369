package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
)

func openTestDB(t *testing.T) *sql.DB {
	return openTestDBMode(t, "WAL")
}

func openTestDBMode(t *testing.T, mode string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "txlimit.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode("+mode+")&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	return db
}

// prepareAll runs a LockShards, InsertShards and WriteShards until the
// store has prepared their statements in the background.
func prepareAll(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	ready := func() bool {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			if _, _, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "warm", Key: "up"}); err != nil {
				return err
			}
			if err := s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "warm", Key: "up", Shards: 1, TS: time.UnixMicro(0)}); err != nil {
				return err
			}
			return s.WriteShards(ctx, tx, []txlimit.ShardWrite{{Name: "warm", Key: "up", Value: 1, TS: time.UnixMicro(1)}})
		}))
		n := 0
		s.stmts.ready.Range(func(_, _ any) bool { n++; return true })
		return n >= 4 // TouchKey, LockShards, InsertShard and WriteShard
	}
	require.Eventually(t, ready, 10*time.Second, time.Millisecond)
}

// A Store's prepared statements belong to its *sql.DB; a transaction of
// another DB still works, on its own DB, with the SQL text.
func TestTxOfAnotherDB(t *testing.T) {
	ctx := context.Background()
	s := New(openTestDB(t))
	prepareAll(t, s)

	other := openTestDB(t)
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 1, Value: 7, TS: time.UnixMicro(0)}))
	rows, _, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, 7.0, rows[0].Value)
	require.NoError(t, tx.Commit())

	var n int
	require.NoError(t, other.QueryRow(`SELECT count(*) FROM txlimit WHERE name = 'n'`).Scan(&n))
	require.Equal(t, 1, n, "the row is in the transaction's DB")
	require.NoError(t, s.db.QueryRow(`SELECT count(*) FROM txlimit WHERE name = 'n'`).Scan(&n))
	require.Equal(t, 0, n, "and not in the store's")
}

// With a pool of one connection, the transaction holds the only connection:
// preparing must not wait for it inside the call. Every call completes,
// prepared or not, and the limit counts exactly.
func TestOneConnectionPool(t *testing.T) {
	db := openTestDB(t)
	db.SetMaxOpenConns(1)
	frozen := time.UnixMicro(1_700_000_000_000_000)
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
		n := 0
		store.stmts.ready.Range(func(_, _ any) bool { n++; return true })
		return n >= 4
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
// what the text would, and another Store of the same DB shares them.
func TestPreparedStatements(t *testing.T) {
	ctx := context.Background()
	s := New(openTestDB(t))
	prepareAll(t, s)

	for _, v := range []float64{3, 4} {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			if _, _, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "warm", Key: "up"}); err != nil {
				return err
			}
			return s.WriteShards(ctx, tx, []txlimit.ShardWrite{{Name: "warm", Key: "up", Value: v, TS: time.UnixMicro(2)}})
		}))
		require.NoError(t, s.InTx(ctx, true, func(tx *sql.Tx) error {
			rows, _, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "warm", Key: "up"})
			require.NoError(t, err)
			require.Len(t, rows, 1)
			require.Equal(t, v, rows[0].Value)
			return nil
		}))
	}

}

// In rollback-journal mode a connection the pool opened to prepare could
// make another's COMMIT fail: the store learns the mode and prepares
// nothing.
func TestRollbackJournalPreparesNothing(t *testing.T) {
	ctx := context.Background()
	s := New(openTestDBMode(t, "delete"))
	for i := range 20 {
		require.NoError(t, s.InTx(ctx, false, func(tx *sql.Tx) error {
			if _, _, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"}); err != nil {
				return err
			}
			if err := s.InsertShards(ctx, tx, txlimit.InsertParams{Name: "n", Key: "k", Shards: 1, TS: time.UnixMicro(0)}); err != nil {
				return err
			}
			return s.WriteShards(ctx, tx, []txlimit.ShardWrite{{Name: "n", Key: "k", Value: float64(i), TS: time.UnixMicro(1)}})
		}))
	}
	require.Equal(t, modeOther, s.stmts.mode.Load())
	s.stmts.pending.Range(func(q, _ any) bool { t.Errorf("preparing %q", q); return true })
	s.stmts.ready.Range(func(q, _ any) bool { t.Errorf("prepared %q", q); return true })
	require.NoError(t, s.InTx(ctx, true, func(tx *sql.Tx) error {
		rows, _, err := s.ReadShards(ctx, tx, txlimit.KeyParams{Name: "n", Key: "k"})
		require.NoError(t, err)
		require.Equal(t, 19.0, rows[0].Value)
		return nil
	}))
}
