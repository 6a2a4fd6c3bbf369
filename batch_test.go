package txlimit_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// SendBatch on a store whose driver sends one statement at a time
// (database/sql) is refused before anything is sent, with an error that
// names what to use instead; the transaction goes on and commits its own
// work, and nothing of the limit was written. pgstore's own tests cover
// the batches it sends.
func TestSendBatchRefusedOnDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limits := map[string]txlimit.Config{"n": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour}}
	refused := func(t *testing.T, db *sql.DB, store driver.Store[*sql.Tx]) {
		_, err := db.ExecContext(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY)`)
		require.NoError(t, err)
		l, err := txlimit.New(store, limits, nil)
		require.NoError(t, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()

		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (id) VALUES (1)`)
		req := txlimit.Request{Name: "n", Key: "k"}
		for what, call := range map[string]func() (txlimit.MultiResult, error){
			"a *pgx.Batch": func() (txlimit.MultiResult, error) { return txlimit.SendBatch(ctx, l, tx, b, req) },
			"statements": func() (txlimit.MultiResult, error) {
				return txlimit.SendBatch(ctx, l, tx, []string{b.QueuedQueries[0].SQL}, req)
			},
		} {
			res, err := call()
			var inv *txlimit.InvalidError
			require.ErrorAs(t, err, &inv, what)
			require.Equal(t, "batch", inv.Field, what)
			require.ErrorContains(t, err, "take the limits with LimitTx or LimitAllTx before the statements instead", what)
			require.False(t, res.OK, what)
		}

		// tx goes on.
		_, err = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (2)`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		var ids []int64
		rows, err := db.QueryContext(ctx, `SELECT id FROM orders`)
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []int64{2}, ids)
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM txlimit`).Scan(&n))
		require.Zero(t, n, "nothing of the limit was written")
	}
	t.Run("sqlitestore", func(t *testing.T) {
		t.Parallel()
		db := testdb.OpenSQLite(t)
		refused(t, db, sqlitestore.New(db))
	})
	t.Run("pgsqlstore", func(t *testing.T) {
		t.Parallel()
		db := stdlib.OpenDBFromPool(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 2))
		t.Cleanup(func() { _ = db.Close() })
		refused(t, db, pgsqlstore.New(db))
	})
}
