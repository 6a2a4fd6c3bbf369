// Command quickstart shows txlimit on SQLite, with nothing to install and no
// server to run:
//
//	go run ./examples/quickstart
//
// It creates a SQLite database file in a temporary directory (removed at
// exit), applies txlimit's migrations, and sends messages under the limit
// "sendMessage": each send is one transaction that consumes the limit and
// inserts the message, so a send that does not commit spends nothing.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver, registered as "sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/sqlitestore"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// dsn is the configuration the sqlitestore package documents: wait for the
// write lock instead of failing (busy_timeout), let readers and the writer
// proceed together (WAL), and take the write lock at BEGIN (_txlock=immediate)
// so that two transactions can never both read a limit before spending it.
const dsn = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// limit is the name of the one limit the quickstart defines.
const limit = "sendMessage"

func run(ctx context.Context, w io.Writer) error {
	dir, err := os.MkdirTemp("", "txlimit-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+dsn)
	if err != nil {
		return err
	}
	defer db.Close()

	// txlimit's table, recorded in goose's version table of txlimit's own,
	// then the application's table.
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE messages (
		id       INTEGER PRIMARY KEY,
		sender   TEXT NOT NULL,
		body     TEXT NOT NULL,
		send_at  TEXT NOT NULL
	)`); err != nil {
		return err
	}

	// The limiter reads this clock instead of the real one so that every
	// run prints the same numbers, which main_test.go checks byte for byte.
	// In production leave Options.Clock unset: the limiter then reads the
	// database's clock (PostgreSQL's; for SQLite, which has none, the
	// process clock, read once the write lock is held).
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	limiter, err := txlimit.New(sqlitestore.New(db), map[string]txlimit.Config{
		limit: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute, Capacity: 3},
	}, &txlimit.Options{Clock: func() time.Time { return now }})
	if err != nil {
		return err
	}
	value := func(user string) (string, error) {
		// Check says what a call would get now, taking nothing; its
		// Remaining is the tokens the limit holds.
		res, err := limiter.Check(ctx, limit, user)
		return tokens(res.Remaining), err
	}

	fmt.Fprintf(w, "Limit %q: 3 messages per minute per user, bursts of up to 3 (token bucket).\n", limit)
	fmt.Fprintf(w, "The limiter's clock stands at %s UTC and moves only when told to.\n\n", now.Format(time.DateTime))

	fmt.Fprintln(w, "alice sends 4 messages in a row; each send is one transaction:")
	for i := 1; i <= 4; i++ {
		res, err := send(ctx, db, limiter, "alice", fmt.Sprintf("hello %d", i))
		if err != nil {
			return err
		}
		if !res.OK {
			fmt.Fprintf(w, "  message %d denied, retry after %v; the transaction was rolled back\n", i, res.RetryAfter)
			continue
		}
		left, err := value("alice")
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  message %d sent, %s left\n", i, left)
	}

	fmt.Fprintln(w, "\nbob sends 1 message, then rolls back a second send after LimitTx:")
	if _, err := send(ctx, db, limiter, "bob", "hi"); err != nil {
		return err
	}
	before, err := value("bob")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  before the second send: %s\n", before)
	inside, err := consumeThenRollBack(ctx, db, limiter, "bob")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  inside its transaction, after LimitTx: %s\n", tokens(inside))
	after, err := value("bob")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  after the rollback: %s (the token came back)\n", after)

	fmt.Fprintln(w, "\nalice has no tokens left, so she schedules a message with a reservation:")
	res, err := schedule(ctx, db, limiter, "alice", "see you later")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  reserved: OK=%v, RetryAfter=%v; the message is stored to be sent at %s\n",
		res.OK, res.RetryAfter, res.At.Add(res.RetryAfter).Format(time.TimeOnly))
	left, err := value("alice")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  alice now has %s: the reservation is a debt that refills first\n", left)

	fmt.Fprintln(w, "\nFinal state:")
	if err := report(ctx, w, db, value); err != nil {
		return err
	}

	now = now.Add(time.Minute)
	fmt.Fprintf(w, "\nOne minute later (%s), with 3 tokens refilled per minute:\n", now.Format(time.TimeOnly))
	return report(ctx, w, db, value)
}

// send sends one message: the limit is consumed and the message inserted in
// the same transaction, which commits only when the limit allowed it.
func send(ctx context.Context, db *sql.DB, limiter *txlimit.Limiter[*sql.Tx], user, body string) (txlimit.Result, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return txlimit.Result{}, err
	}
	defer tx.Rollback() // a no-op once committed
	res, err := limiter.LimitTx(ctx, tx, limit, user)
	if err != nil || !res.OK {
		return res, err // a denial wrote nothing; rolling back is all there is to do
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO messages (sender, body, send_at) VALUES (?, ?, ?)`,
		user, body, res.At.Format(time.RFC3339)); err != nil {
		return txlimit.Result{}, err
	}
	return res, tx.Commit()
}

// consumeThenRollBack consumes a token for user and then rolls back, as a
// send whose business write failed would. It returns the tokens the
// transaction saw after LimitTx.
func consumeThenRollBack(ctx context.Context, db *sql.DB, limiter *txlimit.Limiter[*sql.Tx], user string) (float64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if _, err := limiter.LimitTx(ctx, tx, limit, user); err != nil {
		return 0, err
	}
	res, err := limiter.CheckTx(ctx, tx, limit, user)
	if err != nil {
		return 0, err
	}
	return res.Remaining, tx.Rollback()
}

// schedule reserves a token for a message to be sent later, at the time
// the reservation says, and stores the message in the same transaction.
func schedule(ctx context.Context, db *sql.DB, limiter *txlimit.Limiter[*sql.Tx], user, body string) (txlimit.Result, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return txlimit.Result{}, err
	}
	defer tx.Rollback()
	res, err := limiter.LimitTx(ctx, tx, limit, user, txlimit.Reserve())
	if err != nil || !res.OK {
		return res, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO messages (sender, body, send_at) VALUES (?, ?, ?)`,
		user, body, res.At.Add(res.RetryAfter).Format(time.RFC3339)); err != nil {
		return txlimit.Result{}, err
	}
	return res, tx.Commit()
}

// report prints each user's tokens and messages, and the messages in all.
func report(ctx context.Context, w io.Writer, db *sql.DB, value func(user string) (string, error)) error {
	for _, user := range []string{"alice", "bob"} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM messages WHERE sender = ?`, user).Scan(&n); err != nil {
			return err
		}
		v, err := value(user)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %-6s %s, %s\n", user+":", v, plural(n, "message"))
	}
	var total int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM messages`).Scan(&total); err != nil {
		return err
	}
	fmt.Fprintf(w, "  the messages table holds %s\n", plural(total, "row"))
	return nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// tokens formats a token count for people: at most 6 significant digits,
// so that the float arithmetic of a refill does not show.
func tokens(v float64) string {
	s := strconv.FormatFloat(v, 'g', 6, 64)
	if s == "1" {
		return s + " token"
	}
	return s + " tokens"
}
