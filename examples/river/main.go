// Command river turns txlimit reservations into River jobs scheduled for
// when the reserved tokens exist: "do it later" instead of "try again later".
//
// A user may send 2 emails at once and then 1 per second, and may run 4
// emails ahead. SendEmail takes a token in the same pgx transaction that
// inserts the River job that sends the email; when the user has no token
// left, it reserves one and schedules the job for Result.At +
// Result.RetryAfter. The worker never checks the limit again. A user more
// than 4 emails ahead is refused, and nothing is enqueued. A duplicate
// request rolls back its reservation together with its job. A cancelled
// email gives its token back (JobCancelTx and CreditTx in one transaction).
//
// The program works in a schema of its own, created at the start (txlimit's
// goose migrations and River's migrations run there) and dropped at the end.
// It waits for the jobs to run, prints a timeline and checks that no job ran
// before its scheduled time:
//
//	cd examples/river && go run .
//
// TEST_DATABASE_URL selects the server, as it does for the tests (one
// variable for the PostgreSQL the repository's programs and tests use); it
// defaults to the local test server,
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultDatabaseURL), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, databaseURL string, out io.Writer) error {
	app, err := Setup(ctx, databaseURL, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "schema %s: txlimit's and River's migrations applied\n\n", app.Schema)
	_, err = app.Demo(ctx, out)
	app.Close(context.WithoutCancel(ctx))
	fmt.Fprintf(out, "\nschema %s dropped\n", app.Schema)
	return err
}
