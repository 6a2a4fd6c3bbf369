package sqldrivers

import (
	"cmp"
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// pgsqlstore on a MySQL or MariaDB *sql.DB says so, at Ping and at the
// first call in a transaction. TEST_MYSQL_DSN selects the server; without
// one answering the test skips.
func TestPgsqlstoreOnMariaDB(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", cmp.Or(os.Getenv("TEST_MYSQL_DSN"), "root:@tcp(127.0.0.1:3306)/test"))
	require.NoError(t, err)
	defer db.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		t.Skipf("SKIPPING: no MySQL or MariaDB (set TEST_MYSQL_DSN): %v", err)
	}
	l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
		"n": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
	}, nil)
	require.NoError(t, err)

	err = l.Ping(ctx)
	require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "it is MySQL or MariaDB")

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = l.LimitTx(ctx, tx, "n", "k")
	require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "it is MySQL or MariaDB")
}
