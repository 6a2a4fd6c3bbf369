package main

// These tests run the example against a real PostgreSQL: TEST_DATABASE_URL,
// else the local test server. Each test gets a schema of its own, created by
// Setup and dropped by Close.

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"gorm.io/gorm"

	"github.com/txlimit/txlimit"
)

// testDatabaseURL returns the server to test against. Without one the tests
// skip, loudly, except under CI=true, where they fail.
func testDatabaseURL(t *testing.T) string {
	t.Helper()
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", url)
	if err == nil {
		err = db.PingContext(ctx)
		_ = db.Close()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING the database/sql example's tests: no PostgreSQL at %s: %v (set TEST_DATABASE_URL or start a local server)", url, err)
	}
	return url
}

var frozen = func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }

func setupApp(t *testing.T) *App {
	t.Helper()
	app, err := Setup(context.Background(), testDatabaseURL(t), frozen)
	require.NoError(t, err)
	t.Cleanup(func() { app.Close(context.Background()) })
	app.DB.SetMaxOpenConns(20)
	return app
}

func TestDemo(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), testDatabaseURL(t), frozen, &out))
	want := `Limit "postComment": 2 comments a minute per user (token bucket), one pgsqlstore limiter on one *sql.DB.
`
	for _, u := range []string{"alice posts 3 comments through GORM", "bob posts 3 comments through bun", "carol posts 3 comments through sqlx"} {
		want += "\n" + u + `, each in one transaction:
  comment 1 posted
  comment 2 posted
  comment 3 denied, retry after 30s; the transaction was rolled back
  stored: 2 comments; tokens left: 0
`
	}
	require.Equal(t, want, out.String())
}

var errAbort = errors.New("abort after LimitTx")

// Each library's transaction is the one LimitTx consumed in: when it rolls
// back after LimitTx, the token comes back and nothing is stored.
func TestRollbackReturnsTheToken(t *testing.T) {
	t.Parallel()
	app := setupApp(t)
	ctx := context.Background()
	for via, post := range map[string]func(user string) error{
		"gorm": func(user string) error {
			return app.Gorm.Transaction(func(tx *gorm.DB) error {
				res, err := app.Limiter.LimitTx(ctx, tx.Statement.ConnPool.(*sql.Tx), commentLimit, user)
				require.NoError(t, err)
				require.True(t, res.OK)
				require.NoError(t, tx.Table("comments").Create(&Comment{Author: user, Body: "x", Via: "gorm"}).Error)
				return errAbort
			})
		},
		"bun": func(user string) error {
			return app.Bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				res, err := app.Limiter.LimitTx(ctx, tx.Tx, commentLimit, user)
				require.NoError(t, err)
				require.True(t, res.OK)
				_, err = tx.NewInsert().Model(&Comment{Author: user, Body: "x", Via: "bun"}).Exec(ctx)
				require.NoError(t, err)
				return errAbort
			})
		},
		"sqlx": func(user string) error {
			tx, err := app.Sqlx.BeginTxx(ctx, nil)
			require.NoError(t, err)
			res, err := app.Limiter.LimitTx(ctx, tx.Tx, commentLimit, user)
			require.NoError(t, err)
			require.True(t, res.OK)
			_, err = tx.ExecContext(ctx, `INSERT INTO comments (author, body, via) VALUES ($1, 'x', 'sqlx')`, user)
			require.NoError(t, err)
			require.NoError(t, tx.Rollback())
			return errAbort
		},
	} {
		user := "rollback-" + via
		for range 3 { // more than the capacity: each token came back
			require.ErrorIs(t, post(user), errAbort)
		}
		read, err := app.Limiter.Check(ctx, commentLimit, user)
		require.NoError(t, err)
		require.Equal(t, 2.0, read.Remaining, via)
		var n int
		require.NoError(t, app.DB.QueryRow(`SELECT count(*) FROM comments WHERE author = $1`, user).Scan(&n))
		require.Zero(t, n, via)
	}
}

// Concurrent posts for one user through the three libraries at once, each
// transaction on its own connection: exactly the capacity is granted, and
// exactly the granted comments are stored.
func TestConcurrentPostsAdmitExactlyTheCapacity(t *testing.T) {
	t.Parallel()
	app := setupApp(t)
	ctx := context.Background()
	const perLibrary = 6
	var mu sync.Mutex
	var granted, denied int
	var wg sync.WaitGroup
	for _, post := range []func(ctx context.Context, author, body string) error{app.PostWithGORM, app.PostWithBun, app.PostWithSqlx} {
		for range perLibrary {
			wg.Go(func() {
				err := post(ctx, "dave", "hi")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					granted++
				case errors.Is(err, txlimit.ErrRateLimited):
					denied++
				default:
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, 2, granted)
	require.Equal(t, 3*perLibrary-2, denied)
	var n int
	require.NoError(t, app.DB.QueryRow(`SELECT count(*) FROM comments WHERE author = 'dave'`).Scan(&n))
	require.Equal(t, 2, n)
}
