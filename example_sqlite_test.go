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

// A limit consumed in the same SQLite transaction as the write it guards:
// the message row and the spent token commit together.
func Example_sqlite() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txlimit-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The DSN the sqlitestore package documents: wait for the write lock,
	// WAL, and BEGIN IMMEDIATE.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE messages (sender TEXT NOT NULL, body TEXT NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	// A fixed clock keeps the output the same on every run; in production
	// leave Options nil.
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"sendMessage": {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	send := func(user, body string) (txlimit.Result, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return txlimit.Result{}, err
		}
		defer tx.Rollback()
		res, err := limiter.LimitTx(ctx, tx, "sendMessage", user)
		if err != nil || !res.OK {
			return res, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO messages VALUES (?, ?)", user, body); err != nil {
			return txlimit.Result{}, err
		}
		return res, tx.Commit()
	}

	for _, body := range []string{"one", "two", "three"} {
		res, err := send("alice", body)
		if err != nil {
			log.Fatal(err)
		}
		if res.OK {
			fmt.Printf("%s: sent\n", body)
		} else {
			fmt.Printf("%s: rate limited, retry after %v\n", body, res.RetryAfter)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM messages").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("messages stored:", n)
	// Output:
	// one: sent
	// two: sent
	// three: rate limited, retry after 30s
	// messages stored: 2
}

// A transaction that rolls back after LimitTx gives its tokens back.
func ExampleLimiter_LimitTx() {
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
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"export": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	// Check with Count(0) reads the limit: Remaining is what it holds.
	before, err := limiter.Check(ctx, "export", "acme", txlimit.Count(0))
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	res, err := limiter.LimitTx(ctx, tx, "export", "acme", txlimit.Count(2))
	if err != nil {
		log.Fatal(err)
	}
	inside, err := limiter.CheckTx(ctx, tx, "export", "acme", txlimit.Count(0))
	if err != nil {
		log.Fatal(err)
	}
	// The export fails, say, and the transaction rolls back.
	if err := tx.Rollback(); err != nil {
		log.Fatal(err)
	}
	after, err := limiter.Check(ctx, "export", "acme", txlimit.Count(0))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("OK:", res.OK)
	fmt.Println("before:", before.Remaining)
	fmt.Println("inside the transaction:", inside.Remaining)
	fmt.Println("after the rollback:", after.Remaining)
	// Output:
	// OK: true
	// before: 5
	// inside the transaction: 3
	// after the rollback: 5
}

// A reservation takes tokens the limit does not have yet: the caller owns
// them and runs the work after RetryAfter, without checking again.
func ExampleReserve() {
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
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		// One call per 10 s to a partner API, at most 3 calls queued.
		"partnerAPI": {Kind: txlimit.TokenBucket, Rate: 1, Period: 10 * time.Second, MaxReserved: 3},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	for i := 1; i <= 5; i++ {
		// Limit is LimitTx in a transaction of its own; a job queue would
		// enqueue the call in the same transaction, to run at res.At +
		// res.RetryAfter.
		res, err := limiter.Limit(ctx, "partnerAPI", "", txlimit.Reserve())
		if err != nil {
			log.Fatal(err)
		}
		switch {
		case res.OK && res.RetryAfter > 0:
			fmt.Printf("call %d: reserved, run at %s\n", i, res.At.Add(res.RetryAfter).Format(time.TimeOnly))
		case res.OK:
			fmt.Printf("call %d: run now\n", i)
		default:
			fmt.Printf("call %d: denied, the queue is full; retry after %v\n", i, res.RetryAfter)
		}
	}
	// Output:
	// call 1: run now
	// call 2: reserved, run at 12:00:10
	// call 3: reserved, run at 12:00:20
	// call 4: reserved, run at 12:00:30
	// call 5: denied, the queue is full; retry after 10s
}

// Result.Err turns a denial into an error for code that returns errors; a
// granted result, a reservation included, gives nil.
func ExampleResult_Err() {
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
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"login": {Kind: txlimit.FixedWindow, Rate: 1, Period: time.Minute, Start: now},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	login := func(user string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		res, err := limiter.LimitTx(ctx, tx, "login", user)
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		// … check the password, record the session …
		return tx.Commit()
	}

	fmt.Println("first login:", login("bob"))
	err = login("bob")
	fmt.Println("second login:", err)
	var limited *txlimit.RateLimitedError
	if errors.Is(err, txlimit.ErrRateLimited) && errors.As(err, &limited) {
		fmt.Printf("tell %s to wait %v\n", limited.Key, limited.RetryAfter)
	}
	// Output:
	// first login: <nil>
	// second login: txlimit: limit "login" key "bob": rate limited, retry after 1m0s
	// tell bob to wait 1m0s
}

// Idempotent charges a request once however often its client retries it:
// the retries take nothing and get the first call's Result.
func ExampleIdempotent() {
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
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		"api": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}

	// The client sends request req-1 three times (its first two responses
	// were lost), then req-2.
	for _, requestID := range []string{"req-1", "req-1", "req-1", "req-2"} {
		res, err := limiter.Limit(ctx, "api", "alice", txlimit.Idempotent(requestID, 24*time.Hour))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: OK %v, repeat %v, remaining %v\n", requestID, res.OK, res.Repeat, res.Remaining)
	}
	// The same key for another request is refused.
	_, err = limiter.Limit(ctx, "api", "bob", txlimit.Idempotent("req-2", 24*time.Hour))
	fmt.Println(errors.Is(err, txlimit.ErrIdempotencyMismatch))
	// Output:
	// req-1: OK true, repeat false, remaining 9
	// req-1: OK true, repeat true, remaining 9
	// req-1: OK true, repeat true, remaining 9
	// req-2: OK true, repeat false, remaining 8
	// true
}
