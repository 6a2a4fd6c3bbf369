package sqltx_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit/internal/sqltx"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// WrongDatabase names each database with the store to use on it, in one
// style, and nothing when the database is the one the store wants.
func TestWrongDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wrong := errors.New("txlimit/xstore: the database is not X")
	pg := stdlib.OpenDBFromPool(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeExec, 2))
	t.Cleanup(func() { _ = pg.Close() })
	dbs := map[sqltx.Database]*sql.DB{
		sqltx.PostgreSQL: pg,
		sqltx.SQLite:     testdb.OpenSQLite(t),
		sqltx.MySQL:      mysqltest.Open(t, mysqltest.EmptyDatabase(t), 1),
	}
	use := map[sqltx.Database]string{
		sqltx.PostgreSQL: "it is PostgreSQL", sqltx.SQLite: "it is SQLite", sqltx.MySQL: "it is MySQL or MariaDB",
	}
	stores := map[sqltx.Database]string{
		sqltx.PostgreSQL: "use pgsqlstore.New(db) for *sql.Tx, or pgstore.New(pool) for pgx",
		sqltx.SQLite:     "use sqlitestore.New(db)", sqltx.MySQL: "use mysqlstore.New(db)",
	}
	for found, db := range dbs {
		// A statement only another database runs fails here.
		_, cause := db.ExecContext(ctx, "SELECT no_such_function_anywhere()")
		require.Error(t, cause)
		for want := range dbs {
			err := sqltx.WrongDatabase(ctx, db, cause, wrong, want)
			if want == found {
				require.NoError(t, err, "%s on itself", use[found])
				continue
			}
			require.ErrorIs(t, err, wrong)
			require.ErrorIs(t, err, cause, "the statement's error stays reachable")
			require.ErrorContains(t, err, use[found])
			require.ErrorContains(t, err, stores[found])
		}
	}
	require.NoError(t, sqltx.WrongDatabase(ctx, nil, errors.New("no SQLSTATE"), wrong, sqltx.SQLite), "nothing to ask")
	require.NoError(t, sqltx.WrongDatabase(ctx, dbs[sqltx.MySQL], context.Canceled, wrong, sqltx.PostgreSQL), "a call given up tells nothing")
}
