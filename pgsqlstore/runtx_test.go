package pgsqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
)

func TestRunTxRetriesASerializationFailure(t *testing.T) {
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeExec, 4))
	defer db.Close()
	l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
		"runtx": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "runtx", "k") // the row exists from here on
	require.NoError(t, err)

	// A takes its snapshot, B takes a token and commits, then A takes a
	// token: under SERIALIZABLE, PostgreSQL aborts A with 40001.
	aRead, bDone := make(chan struct{}), make(chan struct{})
	go func() {
		<-aRead
		if _, err := l.Limit(ctx, "runtx", "k"); err != nil {
			t.Error(err)
		}
		close(bDone)
	}()
	var attempts int
	var errs []error
	err = pgsqlstore.RunTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelSerializable}, func(tx *sql.Tx) error {
		attempts++
		if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
			return err
		}
		if attempts == 1 {
			close(aRead)
			<-bDone
		}
		res, err := l.LimitTx(ctx, tx, "runtx", "k")
		if err != nil {
			errs = append(errs, err)
			return err
		}
		return res.Err()
	})
	require.NoError(t, err)
	require.Equal(t, 2, attempts)
	require.Len(t, errs, 1)
	code, _ := pgproto.SQLState(errs[0])
	require.Equal(t, "40001", code, "%v", errs[0])
	require.True(t, pgsqlstore.Retryable(errs[0]))
	snap, err := l.Check(ctx, "runtx", "k", txlimit.Count(0))
	require.NoError(t, err)
	require.InDelta(t, 7.0, snap.Remaining, 0.01, "three tokens taken: before, by B and by A's second run")

	// fn's own error and a denial are not retried.
	attempts = 0
	mine := errors.New("mine")
	require.ErrorIs(t, pgsqlstore.RunTx(ctx, db, nil, func(*sql.Tx) error { attempts++; return mine }), mine)
	require.Equal(t, 1, attempts)
}

// sqlStateError stands for a driver's error: lib/pq's *pq.Error and pgx's
// *pgconn.PgError both have this method.
type sqlStateError string

func (e sqlStateError) Error() string    { return "SQLSTATE " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{sqlStateError("40001"), true},
		{fmt.Errorf("wrapped: %w", sqlStateError("40P01")), true},
		{sqlStateError("55P03"), true},
		{sqlStateError("08006"), true},
		{sqlStateError("57P01"), true},
		{sqlStateError("23505"), false},
		{sqlStateError("42P01"), false},
		{io.ErrUnexpectedEOF, true},
		{context.Canceled, false},
		{fmt.Errorf("%w: %w", context.DeadlineExceeded, sqlStateError("57014")), false},
		{&txlimit.InvalidError{Field: "Count"}, false},
	} {
		require.Equal(t, tc.want, pgsqlstore.Retryable(tc.err), "%v", tc.err)
	}
}
