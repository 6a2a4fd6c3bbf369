package txlimittest_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/txlimittest"
)

// A test of a limit of 3 messages a minute per user, on SQLite: the clock
// stands still until the test moves it, so that RetryAfter is exact, and the
// rollback assertion checks that a send whose transaction rolls back spends
// nothing.
func Example() {
	t := newExampleT() // in a test: the test's *testing.T
	defer t.finish()
	ctx := context.Background()

	clock := txlimittest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	limiter, db := txlimittest.SQLite(t, map[string]txlimit.Config{
		"sendMessage": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute},
	}, &txlimit.Options{Clock: clock.Now})
	if _, err := db.ExecContext(ctx, "CREATE TABLE messages (sender TEXT NOT NULL, body TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}

	// The code under test: a send takes a token and stores the message in
	// the caller's transaction.
	sendTx := func(tx *sql.Tx, sender, body string) error {
		res, err := limiter.LimitTx(ctx, tx, "sendMessage", sender)
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO messages (sender, body) VALUES (?, ?)", sender, body)
		return err
	}

	for i := 1; i <= 3; i++ {
		res := txlimittest.RequireAdmitted(t, limiter, "sendMessage", "alice")
		fmt.Printf("message %d admitted, %v left\n", i, res.Remaining)
	}
	res := txlimittest.RequireDenied(t, limiter, "sendMessage", "alice", 20*time.Second)
	fmt.Println("message 4 denied, retry after", res.RetryAfter)

	clock.Advance(20 * time.Second)
	txlimittest.RequireRemaining(t, limiter, "sendMessage", "alice", 1)
	fmt.Println("20s later: 1 token")

	txlimittest.RequireRollbackRestores(t, limiter, db.Begin, "sendMessage", "alice", func(tx *sql.Tx) {
		if err := sendTx(tx, "alice", "hello"); err != nil {
			t.Fatal(err)
		}
	})
	var stored int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM messages").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("a send rolled back: still 1 token, %d messages stored\n", stored)

	// Output:
	// message 1 admitted, 2 left
	// message 2 admitted, 1 left
	// message 3 admitted, 0 left
	// message 4 denied, retry after 20s
	// 20s later: 1 token
	// a send rolled back: still 1 token, 0 messages stored
}
