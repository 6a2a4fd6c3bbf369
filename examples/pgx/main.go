// Command pgx shows txlimit inside pgx transactions on PostgreSQL:
//
//	TEST_DATABASE_URL=postgres://user@host:5432/db go run ./examples/pgx
//
// TEST_DATABASE_URL, the variable the tests read too, defaults to the local
// test server, postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
// The program creates a schema of its own, with txlimit's table and a
// messages table in it, and drops it at exit: it never touches other data.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

const defaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// limit is the name of the one limit the example defines.
const limit = "sendMessage"

func main() {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = defaultURL
	}
	if err := run(context.Background(), os.Stdout, url); err != nil {
		fmt.Fprintln(os.Stderr, "pgx example:", err)
		os.Exit(1)
	}
}

// run runs the example in a new schema with a random name, so that two runs
// at once do not meet.
func run(ctx context.Context, w io.Writer, url string) error {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return runInSchema(ctx, w, url, "txlimit_example_"+hex.EncodeToString(b))
}

// runInSchema runs the example in schema, which it creates and drops.
func runInSchema(ctx context.Context, w io.Writer, url, schema string) (err error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	// Every connection of the pool resolves unqualified names in schema:
	// txlimit's migrations, its queries and the example's own all land
	// there.
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	defer func() {
		// Drop the schema even when ctx was cancelled.
		_, dropErr := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		err = errors.Join(err, dropErr)
	}()

	// goose runs on database/sql; OpenDBFromPool gives it the pool's
	// connections, search_path included.
	sqlDB := stdlib.OpenDBFromPool(pool)
	err = migrations.Up(ctx, sqlDB, migrations.Postgres)
	if closeErr := sqlDB.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE messages (
		id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		sender text NOT NULL,
		body   text NOT NULL CONSTRAINT body_not_empty CHECK (body <> '')
	)`); err != nil {
		return err
	}

	// The limiter reads this clock instead of PostgreSQL's so that every run
	// prints the same numbers, which main_test.go checks. In production
	// leave Options.Clock unset: the limiter then reads the database
	// server's clock, on which all application servers agree.
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		limit: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		return err
	}

	fmt.Fprintf(w, "Limit %q: 2 messages per minute per user (token bucket), on PostgreSQL.\n", limit)
	fmt.Fprintf(w, "The limiter's clock stands at %s UTC.\n\n", now.Format(time.DateTime))

	fmt.Fprintln(w, "alice sends 3 messages; each send is one pgx.BeginFunc that calls LimitTx, then inserts:")
	for i := 1; i <= 3; i++ {
		err := sendMessage(ctx, pool, limiter, "alice", fmt.Sprintf("hello %d", i))
		var limited *txlimit.RateLimitedError
		switch {
		case err == nil:
			fmt.Fprintf(w, "  message %d sent\n", i)
		case errors.As(err, &limited):
			fmt.Fprintf(w, "  message %d refused: %v\n", i, err)
			fmt.Fprintf(w, "    errors.Is(err, txlimit.ErrRateLimited) = %v\n", errors.Is(err, txlimit.ErrRateLimited))
			fmt.Fprintf(w, "    errors.As gives a *txlimit.RateLimitedError: Name %q, Key %q, RetryAfter %v\n",
				limited.Name, limited.Key, limited.RetryAfter)
		default:
			return err
		}
	}

	fmt.Fprintln(w, "\nbob sends an empty message: LimitTx takes a token, then the insert fails:")
	// Check reads the limit without taking anything: Remaining is what it
	// holds.
	before, err := limiter.Check(ctx, limit, "bob")
	if err != nil {
		return err
	}
	// sendMessage, with a look at the tokens inside the transaction.
	var inside txlimit.Result
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := limiter.LimitTx(ctx, tx, limit, "bob")
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		if inside, err = limiter.CheckTx(ctx, tx, limit, "bob"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO messages (sender, body) VALUES ($1, $2)", "bob", "")
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("want the insert to fail a constraint, got %v", err)
	}
	after, err := limiter.Check(ctx, limit, "bob")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  before: %s; inside the transaction, after LimitTx: %s\n", tokens(before.Remaining), tokens(inside.Remaining))
	fmt.Fprintf(w, "  the insert failed: SQLSTATE %s, constraint %s\n", pgErr.Code, pgErr.ConstraintName)
	fmt.Fprintf(w, "  after: %s; pgx.BeginFunc rolled back, so the token came back\n", tokens(after.Remaining))

	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM messages").Scan(&n); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nThe messages table holds %d rows.\n", n)
	return nil
}

// sendMessage consumes the limit for user and inserts the message in one
// transaction. A denial is returned as a *txlimit.RateLimitedError, which
// makes pgx.BeginFunc roll back; so does a failed insert, and the token is
// then not spent.
func sendMessage(ctx context.Context, pool *pgxpool.Pool, limiter *txlimit.Limiter[pgx.Tx], user, body string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := limiter.LimitTx(ctx, tx, limit, user)
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO messages (sender, body) VALUES ($1, $2)", user, body)
		return err
	})
}

// tokens formats a token count for people, hiding float noise.
func tokens(v float64) string {
	s := strconv.FormatFloat(v, 'g', 6, 64)
	if s == "1" {
		return s + " token"
	}
	return s + " tokens"
}
