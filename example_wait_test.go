package txlimit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/sqlitestore"
)

// A worker waits for its organisation's limit before each call to an
// external API, and gives up at once when the limit cannot grant it before
// its deadline.
func ExampleLimiter_Wait() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txlimit-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		// 20 calls a second per organisation, in bursts of up to 2.
		"llmCalls": {Kind: txlimit.TokenBucket, Rate: 20, Period: time.Second, Capacity: 2},
		// 1000 tokens of the model an hour per organisation.
		"llmTokens": {Kind: txlimit.TokenBucket, Rate: 1000, Period: time.Hour},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	// Five jobs in a row: the first two go at once, the others wait about
	// 50ms each for their token, sleeping outside any transaction.
	for job := 1; job <= 5; job++ {
		if _, err := limiter.Wait(ctx, "llmCalls", "acme"); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("job %d: calling the API\n", job)
	}

	// WaitN: a prompt of 900 model tokens, then one of 600, which the hour
	// cannot grant within the job's 10 seconds.
	jobCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := limiter.Wait(jobCtx, "llmTokens", "acme", txlimit.Count(900)); err != nil {
		log.Fatal(err)
	}
	fmt.Println("900 tokens granted")
	res, err := limiter.Wait(jobCtx, "llmTokens", "acme", txlimit.Count(600))
	fmt.Println("600 tokens: deadline exceeded:", errors.Is(err, context.DeadlineExceeded),
		"rate limited:", errors.Is(err, txlimit.ErrRateLimited),
		"retry after:", res.RetryAfter.Round(time.Minute))
	fmt.Println("the deadline had not passed yet:", jobCtx.Err() == nil)
	// Output:
	// job 1: calling the API
	// job 2: calling the API
	// job 3: calling the API
	// job 4: calling the API
	// job 5: calling the API
	// 900 tokens granted
	// 600 tokens: deadline exceeded: true rate limited: true retry after: 30m0s
	// the deadline had not passed yet: true
}
