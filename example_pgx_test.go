package txlimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// A limit consumed in the same pgx transaction as the insert it guards. A
// denial returned as an error (Result.Err) makes pgx.BeginFunc roll back, as
// does any other error, and then no token is spent.
//
// This example needs a PostgreSQL server, so go test compiles it but does
// not run it; examples/pgx runs the same code against a real server.
func Example_pgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Once, at start-up: txlimit's table, through goose on database/sql.
	sqlDB := stdlib.OpenDBFromPool(pool)
	if err := migrations.Up(ctx, sqlDB, migrations.Postgres); err != nil {
		log.Fatal(err)
	}
	sqlDB.Close()

	// No Options: the limiter reads PostgreSQL's clock.
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"sendMessage": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := limiter.LimitTx(ctx, tx, "sendMessage", "alice")
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO messages (sender, body) VALUES ($1, $2)", "alice", "hello")
		return err
	})
	var limited *txlimit.RateLimitedError
	switch {
	case err == nil:
		fmt.Println("sent")
	case errors.As(err, &limited):
		fmt.Printf("slow down: retry after %v\n", limited.RetryAfter)
	default:
		log.Fatal(err)
	}
}

// The take rides the COMMIT: Commit runs the work first and commits it
// together with the token, in one round trip with the takes on pgstore. A
// denial rolls the work back and is the error of the commit.
func ExampleLimiter_Commit() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	limiter, err := txlimit.New(pgstore.New(pool), map[string]txlimit.Config{
		"sendMessage": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	_, err = limiter.Commit(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO messages (sender, body) VALUES ($1, $2)", "alice", "hello")
		return err
	}, txlimit.Request{Name: "sendMessage", Key: "alice"})
	var limited *txlimit.RateLimitedError
	switch {
	case err == nil:
		fmt.Println("sent")
	case errors.As(err, &limited):
		fmt.Printf("slow down: retry after %v\n", limited.RetryAfter)
	default:
		log.Fatal(err)
	}
}
