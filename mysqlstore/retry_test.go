package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/mysqlstore"
)

// Two transactions that take two limits in opposite orders, each in its own
// LimitTx, deadlock: InnoDB rolls one back with 1213, which the store's
// error explains and Retryable accepts; RunTx runs it again and both
// succeed. (LimitAll takes several limits in one canonical order and never
// deadlocks: TestLimitAllLocksInOneOrder.)
func TestDeadlockIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Database(t, 4)
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
		"d": {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour},
	}, nil)
	require.NoError(t, err)
	for _, k := range []string{"a", "b"} {
		_, err := l.Limit(ctx, "d", k)
		require.NoError(t, err)
	}
	var runs atomic.Int64
	var deadlocks atomic.Int64
	var firstHeld sync.WaitGroup
	firstHeld.Add(2)
	var wg sync.WaitGroup
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			err := mysqlstore.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				runs.Add(1)
				if _, err := l.LimitTx(ctx, tx, "d", order[0]); err != nil {
					return err
				}
				if first {
					first = false
					firstHeld.Done()
					firstHeld.Wait() // both hold their first key
				}
				_, err := l.LimitTx(ctx, tx, "d", order[1])
				if err != nil && mysqlstore.Retryable(err) {
					var myErr *mysql.MySQLError
					if errors.As(err, &myErr) && myErr.Number == 1213 {
						deadlocks.Add(1)
						if !strings.Contains(err.Error(), "run it again from BEGIN") {
							t.Errorf("the error does not say what to do: %v", err)
						}
					}
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, deadlocks.Load())
	require.EqualValues(t, 3, runs.Load(), "the deadlocked transaction ran again")
	for _, k := range []string{"a", "b"} {
		snap, err := l.Check(ctx, "d", k, txlimit.Count(0))
		require.NoError(t, err)
		require.InDelta(t, 97, snap.Remaining, 0.1, "one token at first, one from each transaction")
	}
}

// A call that waits longer than innodb_lock_wait_timeout for a row another
// transaction holds fails with 1205: retryable, and the message says that
// the transaction is still open and must be rolled back.
func TestLockWaitTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Database(t, 4)
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
		"w": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, nil)
	require.NoError(t, err)
	holder, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	res, err := l.LimitTx(ctx, holder, "w", "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	waiter, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer waiter.Rollback()
	_, err = waiter.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1")
	require.NoError(t, err)
	_, err = l.LimitTx(ctx, waiter, "w", "k")
	var myErr *mysql.MySQLError
	require.ErrorAs(t, err, &myErr)
	require.EqualValues(t, 1205, myErr.Number)
	require.True(t, mysqlstore.Retryable(err))
	require.ErrorContains(t, err, "roll the transaction back")
	_, err = waiter.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT")
	require.NoError(t, err)
}

// Retryable's classification of errors that carry no server error number,
// and of the ones the server refuses to cure.
func TestRetryable(t *testing.T) {
	require.False(t, mysqlstore.Retryable(nil))
	require.False(t, mysqlstore.Retryable(context.Canceled))
	require.False(t, mysqlstore.Retryable(errors.Join(&mysql.MySQLError{Number: 1213}, context.DeadlineExceeded)))
	require.True(t, mysqlstore.Retryable(&mysql.MySQLError{Number: 1213}))
	require.True(t, mysqlstore.Retryable(&mysql.MySQLError{Number: 1205}))
	require.True(t, mysqlstore.Retryable(&mysql.MySQLError{Number: 1047}), "a Galera node that is not synced")
	require.False(t, mysqlstore.Retryable(&mysql.MySQLError{Number: 1062}), "a duplicate key is the application's")
	require.True(t, mysqlstore.Retryable(mysql.ErrInvalidConn))
	require.False(t, mysqlstore.Retryable(&txlimit.InvalidError{Field: "Count"}))

	// A failure to connect: retryable unless the server refused the login
	// or the database does not exist.
	ctx := context.Background()
	bad := mysqltest.Config(t)
	bad.Passwd = "not the password"
	bad.User = "txlimit_no_such_user"
	l, err := txlimit.New(mysqlstore.New(mysqltest.Open(t, bad, 1)), map[string]txlimit.Config{"r": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "r", "k")
	var myErr *mysql.MySQLError
	require.ErrorAs(t, err, &myErr)
	require.EqualValues(t, 1045, myErr.Number)
	require.False(t, mysqlstore.Retryable(err), "access denied: %v", err)

	refused := mysqltest.Config(t)
	refused.Addr = "127.0.0.1:1"
	l, err = txlimit.New(mysqlstore.New(mysqltest.Open(t, refused, 1)), map[string]txlimit.Config{"r": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "r", "k")
	require.Error(t, err)
	require.True(t, mysqlstore.Retryable(err), "a refused connection: %v", err)
}
