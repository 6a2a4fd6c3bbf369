// Command txlimit operates the rate limits that txlimit keeps in a
// PostgreSQL, MySQL, MariaDB or SQLite database: it runs the migrations,
// shows the tokens a limit holds, per shard and in total, lists the keys
// that have state, emptiest first, resets a key and prunes full limits;
// it lists the holders of a concurrency limit's key and releases one; it
// pauses a key until an instant, lists the paused keys and lifts a pause;
// and it shows what a new config would make of a limit's keys before it is
// deployed, and converts them. The form of the DSN selects the store
// (pgstore, mysqlstore, sqlitestore), which the command names on stderr.
//
//	cd cmd/txlimit && go install . # from a checkout of txlimit
//	export TXLIMIT_DSN='postgres://app@db.internal/app?search_path=app'
//	# or 'app:secret@tcp(db.internal:3306)/app', or /var/lib/app/app.db
//	txlimit migrate status
//	txlimit value sendMessage alice -kind token_bucket -rate 10 -period 1m -capacity 20
//	txlimit value api acme -kind monthly -rate 10000 -zone Europe/Berlin
//	txlimit keys -config limits.json
//	txlimit holders exports acme
//	txlimit release exports acme job-42
//	txlimit pause sendMessage alice 2h -kind token_bucket -rate 10 -period 1m -capacity 20
//	txlimit paused
//	txlimit lift sendMessage alice
//
// Run txlimit -help for every command and flag. It is a module of its own, so
// that its dependencies stay out of the library's.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	// The zones of calendar windows load from the machine's tzdata, as in
	// the application, and from this copy on a machine without it (a
	// container image with no zoneinfo).
	_ "time/tzdata"

	"github.com/txlimit/txlimit"
)

// Exit statuses.
const (
	exitOK    = 0 // the command did what it was asked
	exitError = 1 // it could not: the database, a file, a failed migration
	exitUsage = 2 // it was asked wrongly: an unknown command or flag, a missing argument, an invalid config
)

const usage = `txlimit operates the rate limits that github.com/txlimit/txlimit keeps in your
PostgreSQL, MySQL, MariaDB or SQLite database (the table txlimit, one row per limit name,
key and shard).

Usage:
  txlimit COMMAND [ARGUMENTS] [FLAGS]

Commands:
  migrate up         Create or upgrade the table txlimit (safe to run again). The
                     migrations are recorded in their own goose table,
                     txlimit_goose_version, apart from your application's.
  migrate status     List txlimit's migrations and whether each is applied.
  migrate down -yes  Roll back the last migration. Rolling back the first one DROPS
                     the table and the state of every limit: every limit is full again.
  value NAME KEY     The tokens limit NAME holds for KEY now, per shard and in total.
                     Needs the limit's config (flags below, or -config).
  reset NAME KEY     Delete the state of NAME for KEY, every shard: the limit is full
                     again. Needs no config.
  keys [NAME]        The keys that have state (of limit NAME, or of every limit),
                     emptiest first: tokens now as a share of capacity. Keys of limits
                     without a config are listed last, unprojected. Reads every row
                     (of NAME) in one read-only transaction.
  prune              Delete the state of every limit that has refilled to capacity; it
                     changes no decision (a missing row is a full limit). Needs the
                     configs of every limit (-config); rows of other limits are kept.
  holders NAME KEY   The holders of concurrency limit NAME for KEY (the table
                     txlimit_holder): each one's id and expiry, live or expired (an
                     expired holder holds no slot). Needs no config.
  release NAME KEY HOLDER
                     Give back the slot HOLDER holds of NAME for KEY, as the
                     application's Release does: for a holder whose work is known to
                     be gone before its expiry. Needs no config.
  change NAME -to FILE [-inherit S] [-apply]
                     What a new config of limit NAME (in FILE, JSON as for -config)
                     makes of the keys that have state, before you deploy it: per key,
                     the tokens now under the config today (-config or the config
                     flags), after the deploy (the new config reads the rows as they
                     are), and with -inherit what a conversion writes: as_is (the
                     tokens, at most the new capacity), proportionally (the same share
                     of the capacity), additive (plus what the capacity grew) or reset
                     (full). -apply converts each key so, in a transaction of its own,
                     on the new config's windows and shards (docs/config-changes.md).
  pause NAME KEY UNTIL
                     Deny every call of NAME for KEY until UNTIL, an RFC 3339 instant
                     (2026-12-24T18:00:00Z) or a duration from now (2h, 90m), whatever
                     its tokens, as the application's Pause does; pausing again
                     replaces the instant. Needs the limit's config (flags below, or
                     -config): a key without state gets its rows, full.
  lift NAME KEY      Lift the pause of NAME for KEY: its calls are decided by its tokens
                     again. Needs no config.
  paused [NAME]      The keys paused now (of limit NAME, or of every limit), the
                     soonest to end first. Needs no config.

The database keeps no copy of the limits' configs (they live in your code), so the
commands that compute tokens take them from a JSON file (-config) or, for one limit,
from flags, which win over the file:

  {
    "sendMessage": {"kind": "token_bucket", "rate": 10, "period": "1m", "capacity": 20},
    "signup": {"kind": "fixed_window", "rate": 1000, "period": "1h", "shards": 16,
               "start": "1970-01-01T00:00:00Z"},
    "login": {"kind": "sliding_window", "rate": 10, "period": "1m"},
    "api": {"kind": "monthly", "rate": 10000, "zone": "Europe/Berlin"}
  }

Fields are those of txlimit.Config: kind (token_bucket, fixed_window, sliding_window, or
a calendar window: daily, weekly, monthly or yearly), rate (per period, or per calendar
window), period (a Go duration: 1m, 1h30m; none for a calendar window), capacity
(defaults to rate), max_reserved, shards (defaults to 1), start (RFC 3339: the instant the
windows of a fixed or sliding window align to), zone (a calendar window's IANA time zone,
such as Europe/Berlin, or UTC; required for one), week_start (sunday … saturday: the first
day of a weekly window; defaults to sunday). Give the values your application uses:
tokens are projected with them, and txlimit.New checks them as it does in your
application.

Flags (before or after the arguments):
  -dsn DSN         The database; its form selects the store, which the command names
                   on stderr. Defaults to $TXLIMIT_DSN.
                   PostgreSQL (pgstore): postgres://user:pass@host:5432/db?sslmode=disable
                     or postgresql://…; add &search_path=SCHEMA when the table is not
                     in public.
                   MySQL or MariaDB (mysqlstore): user:pass@tcp(host:3306)/db, or
                     user@unix(/run/mysqld/mysqld.sock)/db (go-sql-driver/mysql's form),
                     or mysql://user:pass@host:3306/db (port 3306 when left out); the
                     command sets parseTime and interpolateParams.
                   SQLite (sqlitestore): anything else, a file path (which must exist,
                     but for migrate up) or a file: URI.
  -config FILE     Limits' configs, JSON as above.
  -kind KIND       One limit's config, for value, pause and keys NAME: token_bucket,
                   fixed_window, sliding_window, daily, weekly, monthly or yearly.
  -rate N          tokens per period (per calendar window)
  -period D        e.g. 1m, 24h; none for daily, weekly, monthly and yearly
  -capacity N      defaults to rate
  -max-reserved N  defaults to 0 (no cap)
  -shards N        defaults to 1
  -start T         fixed and sliding windows: RFC 3339 time the windows align to
  -zone ZONE       a calendar window's IANA time zone, e.g. Europe/Berlin, or UTC
                   (required for daily, weekly, monthly and yearly)
  -week-start DAY  the first day of a weekly window: sunday … saturday (default sunday)
  -n N             keys and change: show at most N keys (default 20; 0 for all)
  -batch N         prune: keys per transaction (default 1000)
  -json            value, keys, holders, paused and change: print JSON instead of a table
  -to FILE         change: the new configs
  -inherit S       change: as_is, proportionally, additive or reset
  -apply           change: convert the keys (with -inherit)
  -yes             migrate down: confirm
  -timeout D       give up after D (default 1m)

Keys that are empty or contain spaces, quotes or control characters are printed
Go-quoted ("a b"); give value and reset the key itself, quoted for your shell
(txlimit reset sendMessage 'a b'). After --, every word is an argument, for a key
that begins with a dash: txlimit reset sendMessage -- -x.

Exit status: 0 done; 1 failed (database, file, migration); 2 usage error (unknown
command or flag, missing argument, invalid config).

Examples:
  txlimit migrate up -dsn 'postgres://postgres@127.0.0.1:5432/app?sslmode=disable'
  txlimit keys -dsn 'app:secret@tcp(127.0.0.1:3306)/app' -config limits.json
  txlimit value sendMessage alice -dsn app.db -kind token_bucket -rate 10 -period 1m -capacity 20
  txlimit value api acme -dsn app.db -kind monthly -rate 10000 -zone Europe/Berlin
  txlimit keys sendMessage -dsn app.db -config limits.json -n 50
  txlimit reset sendMessage alice -dsn app.db
  txlimit prune -dsn app.db -config limits.json
  txlimit holders exports acme -dsn app.db
  txlimit release exports acme job-42 -dsn app.db
  txlimit change sendMessage -dsn app.db -config limits.json -to new-limits.json -inherit as_is
  txlimit pause sendMessage alice 2026-12-24T18:00:00Z -dsn app.db -config limits.json
  txlimit paused -dsn app.db
  txlimit lift sendMessage alice -dsn app.db
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args (without the program name) and returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	inv, err := parse(args)
	if err != nil {
		if err == errHelp {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		fmt.Fprintf(stderr, "txlimit: %v\nRun txlimit -help for usage.\n", err)
		return exitUsage
	}
	if err := inv.execute(stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "txlimit: %v\n", err)
		var usage usageError
		if errors.As(err, &usage) || errors.As(err, new(*txlimit.InvalidError)) {
			fmt.Fprintln(stderr, "Run txlimit -help for usage.")
			return exitUsage
		}
		return exitError
	}
	return exitOK
}

// usageError is an error of the command line or the configs, found only
// once the database or the config file is read. A *txlimit.InvalidError
// (a name or key the library refuses) is one too.
type usageError struct{ error }
