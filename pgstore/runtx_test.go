package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestRunTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 8)
	serializable := pgx.TxOptions{IsoLevel: pgx.Serializable}

	t.Run("RetriesASerializationFailure", func(t *testing.T) {
		l, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
			"runtx": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
		}, nil)
		require.NoError(t, err)
		_, err = l.Limit(ctx, "runtx", "k") // the row exists from here on
		require.NoError(t, err)

		// A takes its snapshot, B takes a token and commits, then A takes a
		// token: under SERIALIZABLE, A has read a row a later commit
		// changed, and PostgreSQL aborts it with 40001.
		aRead, bDone := make(chan struct{}), make(chan struct{})
		go func() {
			<-aRead
			_, err := l.Limit(ctx, "runtx", "k")
			if err != nil {
				t.Error(err)
			}
			close(bDone)
		}()
		var attempts int
		var errs []error
		err = pgstore.RunTx(ctx, pool, serializable, func(tx pgx.Tx) error {
			attempts++
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
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
		require.Equal(t, "40001", sqlState(errs[0]), "%v", errs[0])
		snap, err := l.Check(ctx, "runtx", "k", txlimit.Count(0))
		require.NoError(t, err)
		require.InDelta(t, 7.0, snap.Remaining, 0.01, "three tokens taken: before, by B and by A's second run")
	})

	t.Run("RetriesADeadlock", func(t *testing.T) {
		_, err := pool.Exec(ctx, `CREATE TABLE runtx_rows (id int PRIMARY KEY, n int NOT NULL);
			INSERT INTO runtx_rows VALUES (1, 0), (2, 0)`)
		require.NoError(t, err)
		// Two transactions lock the rows in opposite orders, each waiting
		// for the other to hold its first row: PostgreSQL aborts one with
		// 40P01 after deadlock_timeout, and RunTx runs it again. The
		// second waits with a deadlock_timeout of a minute: each waiting
		// backend looks for a deadlock on its own timer, and two checks
		// that run together may each abort their own transaction, so that
		// which one (or both) is chosen would be left to timing.
		var holding sync.WaitGroup
		holding.Add(2)
		var attempts, deadlocks atomic.Int64
		run := func(first, second int, setup string) error {
			var once sync.Once
			return pgstore.RunTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
				attempts.Add(1)
				if _, err := tx.Exec(ctx, setup); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "UPDATE runtx_rows SET n = n + 1 WHERE id = $1", first); err != nil {
					return err
				}
				once.Do(func() { holding.Done(); holding.Wait() })
				_, err := tx.Exec(ctx, "UPDATE runtx_rows SET n = n + 1 WHERE id = $1", second)
				if sqlState(err) == "40P01" {
					deadlocks.Add(1)
				}
				return err
			})
		}
		errc := make(chan error, 2)
		go func() { errc <- run(1, 2, "SELECT 1") }()
		go func() { errc <- run(2, 1, "SET LOCAL deadlock_timeout = '1min'") }()
		require.NoError(t, <-errc)
		require.NoError(t, <-errc)
		require.EqualValues(t, 1, deadlocks.Load())
		require.EqualValues(t, 3, attempts.Load())
		var n1, n2 int
		require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT n FROM runtx_rows WHERE id = 1), (SELECT n FROM runtx_rows WHERE id = 2)").Scan(&n1, &n2))
		require.Equal(t, [2]int{2, 2}, [2]int{n1, n2}, "both transactions committed once")
	})

	t.Run("GivesUpOnANonRetryableErrorAtOnce", func(t *testing.T) {
		var attempts int
		err := pgstore.RunTx(ctx, pool, serializable, func(tx pgx.Tx) error {
			attempts++
			_, err := tx.Exec(ctx, "SELECT 1 / 0")
			return err
		})
		require.Equal(t, "22012", sqlState(err), "%v", err)
		require.Equal(t, 1, attempts)

		mine := errors.New("the business rule said no")
		attempts = 0
		err = pgstore.RunTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			attempts++
			return mine
		})
		require.Same(t, mine, err)
		require.Equal(t, 1, attempts)
	})

	t.Run("BoundedAttempts", func(t *testing.T) {
		var attempts int
		err := pgstore.RunTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			attempts++
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			return err
		})
		require.Equal(t, pgstore.RunTxAttempts, attempts)
		require.Equal(t, "40001", sqlState(err))
		require.ErrorContains(t, err, "gave up after 5 attempts")
	})

	t.Run("StopsWhenTheContextEnds", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var attempts int
		err := pgstore.RunTx(cctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			attempts++
			_, err := tx.Exec(cctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			cancel()
			return err
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, "40001", sqlState(err))
		require.Equal(t, 1, attempts)

	})
}

// TestRetryableConnectErrors connects to the test server in ways that fail
// and checks which failures Retryable calls transient.
func TestRetryableConnectErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, err := pgx.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	connect := func(t *testing.T, change func(c *pgx.ConnConfig)) error {
		c := base.Copy()
		change(c)
		conn, err := pgx.ConnectConfig(ctx, c)
		if err == nil {
			_ = conn.Close(ctx)
		}
		require.Error(t, err)
		var connectErr *pgconn.ConnectError
		require.ErrorAs(t, err, &connectErr)
		return err
	}
	for _, c := range []struct {
		name   string
		change func(c *pgx.ConnConfig)
		want   bool
	}{
		// The primary, asked for a standby: what a client sees while a
		// failover moves the roles (and "read only connection" for the
		// opposite).
		{"WrongRole", func(c *pgx.ConnConfig) {
			c.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsStandby
		}, true},
		{"Refused", func(c *pgx.ConnConfig) { c.Host, c.Port = "127.0.0.1", 1 }, true},
		{"NoSuchDatabase", func(c *pgx.ConnConfig) { c.Database = "txlimit_no_such_database" }, false},
		{"NoSuchRole", func(c *pgx.ConnConfig) { c.User = "txlimit_no_such_role" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := connect(t, c.change)
			require.Equal(t, c.want, pgstore.Retryable(err), "%v", err)
		})
	}
}
