// Command mysql shows txlimit on MySQL or MariaDB: a chat application lets
// each user send 2 messages a minute. Each message is inserted by a
// transaction that also takes a token from the user's limit (LimitTx, on
// mysqlstore), so the message and the token commit or roll back together;
// the third message in a minute is denied, its transaction rolled back, and
// not stored. The transactions run through mysqlstore.RunTx, which runs
// one again when the server rolled it back (a deadlock, or on a Galera
// cluster a conflict with another node).
//
// The program works in a database of its own, created at the start
// (txlimit's goose migrations run there) and dropped at the end:
//
//	cd examples/mysql && go run .
//
// TEST_MYSQL_DSN selects the server, as it does for the tests (a
// go-sql-driver/mysql DSN; the database it names is not used); it defaults
// to the local test server, root:@tcp(127.0.0.1:3306)/. The store needs parseTime=true and
// interpolateParams=true in the DSN; the program adds them.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

const defaultDSN = "root:@tcp(127.0.0.1:3306)/"

// sendLimit is the limit each message takes a token from, per user.
const sendLimit = "sendMessage"

func main() {
	if err := run(context.Background(), cmp.Or(os.Getenv("TEST_MYSQL_DSN"), defaultDSN), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// run creates a database of its own on the server of dsn, sends messages
// through the limiter, prints what happened to out, and drops the
// database.
func run(ctx context.Context, dsn string, out io.Writer) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("TEST_MYSQL_DSN: %w", err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer admin.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	cfg.DBName = "txlimit_example_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+cfg.DBName); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	defer func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+cfg.DBName) }()

	// What mysqlstore needs: DATETIME read as time.Time, and one round trip
	// per statement.
	cfg.ParseTime = true
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.MySQL); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE messages (
		id BIGINT AUTO_INCREMENT PRIMARY KEY, sender VARCHAR(64) NOT NULL, body TEXT NOT NULL)`); err != nil {
		return err
	}
	store := mysqlstore.New(db)
	limiter, err := txlimit.New(store, map[string]txlimit.Config{
		sendLimit: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, nil)
	if err != nil {
		return err
	}
	// Ping names any DSN setting the store lacks, and a missing table.
	if err := limiter.Ping(ctx); err != nil {
		return err
	}
	for _, user := range []string{"alice", "bob"} {
		for i := 1; i <= 3; i++ {
			body := fmt.Sprintf("message %d from %s", i, user)
			sent, err := send(ctx, db, limiter, user, body)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: %s\n", body, sent)
		}
	}
	var stored int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM messages").Scan(&stored); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d messages stored\n", stored)
	return nil
}

// send stores a message when the sender's limit has a token, in one
// transaction with the token.
func send(ctx context.Context, db *sql.DB, limiter *txlimit.Limiter[*sql.Tx], user, body string) (string, error) {
	var outcome string
	err := mysqlstore.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO messages (sender, body) VALUES (?, ?)", user, body); err != nil {
			return err
		}
		res, err := limiter.LimitTx(ctx, tx, sendLimit, user)
		if err != nil {
			return err
		}
		if !res.OK {
			// Returning the error rolls the message back with the call.
			outcome = fmt.Sprintf("denied, retry in %v", res.RetryAfter.Round(time.Second))
			return res.Err()
		}
		outcome = fmt.Sprintf("sent (%.0f left)", res.Remaining)
		return nil
	})
	if errors.Is(err, txlimit.ErrRateLimited) {
		return outcome, nil
	}
	return outcome, err
}
