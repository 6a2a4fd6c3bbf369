package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

// The takes go first in the transaction's own batch: the INSERT after
// them runs only when both limits grant, and the batch with its takes costs
// one round trip. A denial stops the batch before the INSERT takes effect
// and rolls tx back; the deferred Rollback then does nothing.
//
// This example needs a PostgreSQL server, so go test compiles it but does
// not run it.
func ExampleSendBatch() {
	limits := map[string]txlimit.Config{
		"sendMessage":      {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute},
		"sendMessageDaily": {Kind: txlimit.FixedWindow, Rate: 200, Period: 24 * time.Hour},
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	b.Queue("INSERT INTO messages (sender, body) VALUES ($1, $2)", "alice", "hello")
	res, err := pgstore.SendBatch(ctx, limiter, tx, b,
		txlimit.Request{Name: "sendMessage", Key: "alice"},
		txlimit.Request{Name: "sendMessageDaily", Key: "alice"})
	var limited *txlimit.RateLimitedError
	if errors.As(err, &limited) {
		fmt.Printf("slow down: %s says retry after %v\n", limited.Name, limited.RetryAfter)
		return
	}
	if err != nil {
		log.Fatal(err) // the batch's own error, or the database's
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("sent; %v more today\n", res.Results[1].Remaining)
}
