package mysqltest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/mysqlstore"
)

// Harness adapts mysqlstore on db to the conformance suite; its
// transactions run at the isolation level iso (sql.LevelDefault: the
// server's, REPEATABLE READ unless configured otherwise).
func Harness(db *sql.DB, iso sql.IsolationLevel) storetest.Harness[*sql.Tx] {
	return storetest.Harness[*sql.Tx]{
		Store: mysqlstore.New(db),
		Begin: func(t *testing.T) *sql.Tx {
			tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: iso})
			require.NoError(t, err)
			// A failed assertion must not leak the connection.
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		TryBegin: func(ctx context.Context) (*sql.Tx, error) {
			return db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
		},
		Commit:   func(tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(tx *sql.Tx) { _ = tx.Rollback() },
		Exec:     testdb.SQLExec,
		QueryInt: testdb.SQLQueryInt,
		Retryable: func(err error) bool {
			// A transaction whose connection was killed under it ends in
			// database/sql's errors as well as the driver's.
			return mysqlstore.Retryable(err) || errors.Is(err, sql.ErrTxDone) ||
				errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn)
		},
		Kill:  func(ctx context.Context) error { return kill(ctx, db) },
		Rows:  func(t *testing.T, name, key string) []string { return Rows(t, db, name, key) },
		Conns: db.Stats().MaxOpenConnections - 1,
		// A sharded call takes from one shard that no other transaction
		// holds (FOR UPDATE SKIP LOCKED).
		SkipsLocked: true,
		BeginLevel: func(ctx context.Context, level sql.IsolationLevel) (*sql.Tx, error) {
			return db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		},
		Levels: levels(iso),
		Headroom: func(ctx context.Context) (n int64, err error) {
			err = db.QueryRowContext(ctx, "SELECT @@max_connections - (SELECT COUNT(*) FROM information_schema.PROCESSLIST)").Scan(&n)
			return n, err
		},
		Database: func(t *testing.T) string { return testdb.QueryString(t, db, "SELECT DATABASE()") },
	}
}

// levels are the isolation levels the concurrency topic runs at in a suite
// at iso: iso's, and SERIALIZABLE beside InnoDB's default.
func levels(iso sql.IsolationLevel) []sql.IsolationLevel {
	switch iso {
	case sql.LevelDefault, sql.LevelRepeatableRead:
		return []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable}
	}
	return []sql.IsolationLevel{iso}
}

// kill ends a connection of db at random, but not the one it runs on: each
// test's connections have a database of their own (Database).
func kill(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var id int64
	err = conn.QueryRowContext(ctx, `SELECT id FROM information_schema.processlist
		WHERE db = DATABASE() AND id <> CONNECTION_ID() ORDER BY RAND() LIMIT 1`).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10))
	var my *mysql.MySQLError
	if errors.As(err, &my) && my.Number == errNoSuchThread {
		return nil // it ended on its own since
	}
	return err
}

// errNoSuchThread is ER_NO_SUCH_THREAD: KILL of a connection that is gone.
const errNoSuchThread = 1094

// Rows returns the stored rows of (name, key) as text, in shard order: the
// value and prev as the shortest decimals that are the same float64s, the
// time to the microsecond.
func Rows(t *testing.T, db *sql.DB, name, key string) []string {
	t.Helper()
	rows, err := db.Query("SELECT shard, value, prev, ts, paused_until FROM txlimit WHERE name = ? AND `key` = ? ORDER BY shard", []byte(name), []byte(key))
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var shard int
		var value, prev float64
		var ts time.Time
		var paused sql.NullTime
		require.NoError(t, rows.Scan(&shard, &value, &prev, &ts, &paused))
		row := fmt.Sprintf("%d %s %s %s", shard, strconv.FormatFloat(value, 'g', -1, 64),
			strconv.FormatFloat(prev, 'g', -1, 64), ts.Format("2006-01-02 15:04:05.000000"))
		if paused.Valid {
			row += " paused until " + paused.Time.Format("2006-01-02 15:04:05.000000")
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}
