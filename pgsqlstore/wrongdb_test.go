package pgsqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// pgsqlstore on a MySQL or MariaDB *sql.DB says so, at Ping and at the
// first call in a transaction. The server is the one mysqlstore's tests
// use (TEST_MYSQL_DSN, else 127.0.0.1:3306): without one the test skips,
// except under CI=true.
func TestPgsqlstoreOnMariaDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Open(t, mysqltest.EmptyDatabase(t), 1)
	l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
		"n": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second},
	}, nil)
	require.NoError(t, err)

	err = l.Ping(ctx)
	require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "it is MySQL or MariaDB")

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = l.LimitTx(ctx, tx, "n", "k")
	require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "it is MySQL or MariaDB")
}
