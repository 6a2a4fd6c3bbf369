// Package pgxtest adapts pgstore to the conformance suite
// (internal/testkit/storetest), for pgstore's tests. It is apart from
// testdb, which pgstore's own packages' tests import: it imports pgstore.
package pgxtest

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// Harness adapts store, a store on pool, to the conformance suite
// (storetest) and to the tests that reuse its harness.
func Harness(pool *pgxpool.Pool, store driver.Store[pgx.Tx]) storetest.Harness[pgx.Tx] {
	return storetest.Harness[pgx.Tx]{
		Store: store,
		Begin: func(t *testing.T) pgx.Tx {
			tx, err := pool.Begin(context.Background())
			require.NoError(t, err)
			// A failed assertion must not leak the connection.
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx
		},
		TryBegin: func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
		Commit:   func(tx pgx.Tx) error { return tx.Commit(context.Background()) },
		Rollback: func(tx pgx.Tx) { _ = tx.Rollback(context.Background()) },
		Exec: func(ctx context.Context, tx pgx.Tx, query string) error {
			_, err := tx.Exec(ctx, query)
			return err
		},
		QueryInt: func(ctx context.Context, tx pgx.Tx, query string) (n int64, err error) {
			err = tx.QueryRow(ctx, query).Scan(&n)
			return n, err
		},
		Retryable: func(err error) bool { return pgstore.Retryable(err) || errors.Is(err, pgx.ErrTxClosed) },
		Kill: func(ctx context.Context) error {
			_, err := pool.Exec(ctx, testdb.KillQuery)
			return err
		},
		Rows: func(t *testing.T, name, key string) []string {
			rows, err := pool.Query(context.Background(),
				`SELECT format('%s %s %s %s %s', ctid, shard, value, ts, paused_until) FROM txlimit WHERE name = $1 AND key = $2 ORDER BY shard`,
				name, key)
			require.NoError(t, err)
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return out
		},
		Conns:       int(pool.Config().MaxConns) - 1,
		SkipsLocked: true,
		BeginLevel: func(ctx context.Context, level sql.IsolationLevel) (pgx.Tx, error) {
			return pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: map[sql.IsolationLevel]pgx.TxIsoLevel{
				sql.LevelReadCommitted: pgx.ReadCommitted, sql.LevelRepeatableRead: pgx.RepeatableRead, sql.LevelSerializable: pgx.Serializable,
			}[level]})
		},
		Levels: testdb.PostgresLevels,
		Headroom: func(ctx context.Context) (n int64, err error) {
			err = pool.QueryRow(ctx, testdb.HeadroomQuery).Scan(&n)
			return n, err
		},
		Database: func(*testing.T) string { return pool.Config().ConnConfig.RuntimeParams["search_path"] },
	}
}
