// Command txlimit-bench measures txlimit's LimitTx against the SQL it
// replaces, the hand-written floor (BEGIN; SELECT value, ts … FOR UPDATE;
// UPDATE; COMMIT), and against the Redis limiter its users call beside
// their transaction today, in one run on one PostgreSQL database and one
// Redis, and on a SQLite file:
//
//	cd cmd/txlimit-bench && go run . -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' -out ../../docs/bench
//
// It needs the DSN and a Redis (-redis, default 127.0.0.1:6379;
// scripts/redis.sh starts one; -redis= leaves Redis out): it creates a
// schema of its own (txlimit_bench_…), runs txlimit's migrations, the
// floor's tables and a business table into it, and drops it at the end; its
// Redis keys are txlimit-bench:<run id>:…, deleted at the end. For every
// client count (-clients, default 1, 8 and 32; each client a goroutine with
// its own connection from a pool of that size, and its own Redis
// connection) it measures these scenarios:
//
//   - distinct: each client consumes its own key;
//   - hot: every client consumes one key;
//   - hot-shardsN: every client consumes one key spread over N shards
//     (-shards, default 4, 16 and 64). The floor of these is hand-written
//     SQL over N rows: the first row no other transaction holds going up
//     from a random one (FOR UPDATE SKIP LOCKED), else a wait for that
//     one; each row a bucket of its own, not pooled;
//   - business: each client its own key, and every transaction is a
//     business transaction, BEGIN; INSERT an order; the limit step;
//     COMMIT (ROLLBACK when denied), measured for the floor, txlimit,
//     Redis (seed 003's fixed-window Lua script: server TIME, INCR, EXPIRE
//     on the first call of a window, in one EVALSHA), redis_rate
//     (github.com/go-redis/redis_rate/v10, GCRA, one EVALSHA), both beside
//     the transaction, txlimit/commit (Limiter.Commit: BEGIN; INSERT;
//     the take and COMMIT in one pipeline), txlimit/commit+lease (the same
//     with Config.Lease 64 and LeaseAhead 32, the clients of a limit
//     sharing one Limiter as one process's goroutines do), txlimit/batch
//     (pgstore.SendBatch: BEGIN; the take and the INSERT in one batch;
//     COMMIT) and none (no limit at all: the ceiling);
//   - business-hot: the same business transaction with every client on one
//     key, measured for the floor (on that one row), txlimit,
//     txlimit/shards16 (LimitTx on the key spread over 16 shards),
//     txlimit/commit, txlimit/commit+lease, txlimit/batch, Redis and
//     redis_rate: the answers for a hot key (docs/hot-keys.md);
//   - tpcb and tpcb-hot: pgbench's built-in tpcb-like transaction (UPDATE
//     an account, SELECT its balance, UPDATE a teller, UPDATE the branch,
//     INSERT a history row) on pgbench's tables at scale 1, created in the
//     bench's schema (pgbench_branches, _tellers, _accounts, _history; the
//     pgbench binary is not needed), followed by the limit step: a heavier
//     and standard transaction beside the minimal one. tpcb has a limit
//     per account, each client on an account of its own (distinct keys);
//     tpcb-hot a limit per branch, every client on the one branch's key
//     (one hot key), each transaction on a random account as pgbench's.
//     At scale 1 every transaction updates the one branch row, so the
//     clients queue on it whatever the limit. Measured for none, txlimit
//     (LimitTx after the work), txlimit/commit, txlimit/commit+lease,
//     txlimit/batch (the take ahead of the account's UPDATE in one batch,
//     the rest of the work after it), redis and redis_rate, with the
//     ratios to none and to redis_rate;
//
// The first three measure the floor and txlimit. Each operation is one
// transaction that takes one token: for txlimit pgx.BeginFunc around
// LimitTx, for the floor the four statements above with the token bucket
// computed in Go, for Redis the script beside the transaction. Besides the
// whole call, the limit step alone is timed (LimitTx; the floor's SELECT and
// UPDATE; the EVALSHA): its p50 and p99 in the business scenario, with their
// ratios to the floor's and to Redis's, are the latency measure of the
// limiter inside a business transaction. The implementations are a list
// (pgImpls, sqliteImpls): a txlimit variant, another store or mode, is one
// entry more. Each cell runs -duration (default 2s)
// -repeat times (default 3); the repeats of all cells of a client count are
// interleaved, in an order rotated at every repeat, so that a drift of the
// machine does not bias a ratio, and every number reported is the median of
// the repeats. With -sqlite (default on) the same is done for distinct and hot
// on a WAL file in a temporary directory, at 1 and 8 clients.
//
// The output is a table (ops/s, p50 and p99 latency, the ratio to the floor
// of the same scenario and client count, in the business scenario the ratio
// to Redis, for the sharded scenarios the ratio to the floor on one
// unsharded row, and for the hot scenarios the ratio to the same
// implementation on distinct keys at the same client count), a table of the
// limit step inside a business transaction, and with -out the same as
// results.csv, results.json, results.svg and results.md in that directory.
//
// # Admission checks
//
// A fast wrong answer must not pass, so the command counts what it admits and
// checks it against the limit:
//
//   - every timed run uses a limit of capacity 1e9 refilled at 1 token an
//     hour on the real clock, so every operation must be admitted, and after
//     the run the tokens left must be capacity - admitted, plus at most the
//     refill of the time elapsed (a lost update would leave more);
//   - on a frozen clock, with a capacity of 100 and clients that call until
//     they are denied, exactly 100 must be admitted per key;
//   - on the real clock, with a small capacity (8, or 2 a shard) refilled at
//     a sixteenth of it a second and clients that call until each has been
//     denied, capacity <= admitted <= capacity + rate * elapsed per key;
//   - Redis's limit is a fixed window on Redis's clock, which cannot be
//     frozen: with a window of an hour and 100 calls a window, exactly 100
//     must be admitted per key (at most 100 a window if the run crossed
//     into the next one), and the counters must add up to every call made;
//     its timed runs are checked like the others, its tokens left being
//     the capacity minus the calls Redis counted.
//
// The saturating checks run for every scenario, txlimit and floor (except
// the sharded floor, which does not pool its rows and so cannot admit
// exactly the limit), and Redis on
// distinct keys, the hot key and in both business scenarios, at the largest
// client count. Each check is printed;
// when one fails the command exits with status 1 (after writing its files,
// so that they show the failure).
//
// -quick is a smoke run of well under a minute on an idle machine: short
// cells, one repeat. -subjects measures only the implementations it names
// (none, floor, txlimit, txlimit/pgsqlstore, txlimit/shards16,
// txlimit/commit, txlimit/commit+lease, txlimit/batch, redis, redis_rate),
// for a quick iteration on a few:
//
//	go run . -dsn … -clients 8,32 -subjects floor,txlimit/commit,redis -shards '' -sqlite=false
//
// -profile times every PostgreSQL statement and Redis command (as the client
// sees it: the round trip and any lock wait included) and prints, per cell,
// the mean time per call spent in each kind: BEGIN, the business INSERT, each
// of txlimit's queries by its sqlc name, each batch by its statements, the
// EVALSHA, COMMIT. The timing costs a little, so the
// ops/s of a profiled run are not the ones to quote.
//
// # The figures the docs quote
//
// README.md and docs/*.md quote a run only through blocks this command
// writes from docs/bench/results.json (docs.go, docs_layouts.go): -docs
// rewrites them after a run, -docs-check (CI) fails when one differs. Both
// take the repository's root and need no database:
//
//	cd cmd/txlimit-bench && go run . -docs ../..
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "txlimit-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if cfg.Docs != "" || cfg.DocsCheck != "" {
		err = docsMode(cfg, os.Stdout)
	} else {
		_, err = run(ctx, cfg, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "txlimit-bench:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	DSN    string
	Redis  string // address of the Redis to measure; "" leaves Redis out
	SQLite bool
	// MySQL is the DSN (go-sql-driver/mysql) of the MySQL or MariaDB
	// server to measure; "" leaves it out.
	MySQL         string
	MySQLClients  []int
	Duration      time.Duration // of one timed cell
	Repeats       int
	Clients       []int // PostgreSQL client counts
	SQLiteClients []int
	Shards        []int
	Out           string // directory for results.{csv,json,svg,md}; "" writes none
	Quick         bool
	Profile       bool
	// Subjects are the implementations to measure (-subjects); nil
	// measures every one.
	Subjects []string
	// CheckDuration is how long each real-clock admission check runs.
	CheckDuration time.Duration
	// Command is the command line, recorded in the results.
	Command string
	// Docs and DocsCheck are the repository root whose docs -docs
	// rewrites, or -docs-check checks, from docs/bench/results.json.
	Docs, DocsCheck string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("txlimit-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                          config
		clients, sqliteClients, shds string
		mysqlClients                 string
		subjects                     string
	)
	fs.StringVar(&cfg.DSN, "dsn", "", "PostgreSQL connection string (required), e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	fs.StringVar(&cfg.Redis, "redis", "127.0.0.1:6379", "address of the Redis the Redis limiter runs on (keys txlimit-bench:<run id>:…, deleted at the end); -redis= leaves Redis out")
	fs.BoolVar(&cfg.SQLite, "sqlite", true, "also measure SQLite, on a WAL file in a temporary directory")
	fs.StringVar(&cfg.MySQL, "mysql", "", "also measure MySQL or MariaDB, in a database of its own on this server (a go-sql-driver/mysql DSN, e.g. root:@tcp(127.0.0.1:3306)/); the run adds parseTime and interpolateParams")
	fs.StringVar(&mysqlClients, "mysql-clients", "1,8,32", "MySQL client counts, comma-separated")
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Second, "how long each timed cell runs")
	fs.IntVar(&cfg.Repeats, "repeat", 3, "how many times each cell runs; the median is reported")
	fs.StringVar(&clients, "clients", "1,8,32", "PostgreSQL client counts, comma-separated")
	fs.StringVar(&sqliteClients, "sqlite-clients", "1,8", "SQLite client counts, comma-separated")
	fs.StringVar(&shds, "shards", "4,16,64", "shard counts of the hot-shards scenarios, comma-separated")
	fs.StringVar(&cfg.Out, "out", "", "write results.csv, results.json, results.svg and results.md to this directory")
	fs.BoolVar(&cfg.Quick, "quick", false, "smoke run: 250ms cells, one repeat (well under 30s in all)")
	fs.StringVar(&subjects, "subjects", "", "implementations to measure, comma-separated (default: all): "+strings.Join(subjectNames, ", "))
	fs.BoolVar(&cfg.Profile, "profile", false, "time every PostgreSQL statement and print where each cell's calls spend their time")
	fs.StringVar(&cfg.Docs, "docs", "", "measure nothing: rewrite the bench blocks of README.md and docs/*.md under this repository root from its docs/bench/results.json")
	fs.StringVar(&cfg.DocsCheck, "docs-check", "", "measure nothing: fail when a bench block of README.md or docs/*.md under this repository root differs from its docs/bench/results.json")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: txlimit-bench -dsn postgres://... [-redis 127.0.0.1:6379] [-sqlite] [-mysql root:@tcp(127.0.0.1:3306)/] [-duration 2s] [-repeat 3] [-subjects floor,txlimit/commit,redis] [-out docs/bench] [-quick]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q; every setting is a flag (see -h)", fs.Arg(0))
	}
	var err error
	if cfg.Clients, err = parseCounts("-clients", clients, 1, 512); err != nil {
		return config{}, err
	}
	if cfg.SQLiteClients, err = parseCounts("-sqlite-clients", sqliteClients, 1, 512); err != nil {
		return config{}, err
	}
	if cfg.MySQLClients, err = parseCounts("-mysql-clients", mysqlClients, 1, 512); err != nil {
		return config{}, err
	}
	if cfg.Shards, err = parseCounts("-shards", shds, 2, 1024); err != nil {
		return config{}, err
	}
	if cfg.Subjects, err = parseSubjects(subjects); err != nil {
		return config{}, err
	}
	cfg.Command = "txlimit-bench " + strings.Join(redactDSN(args), " ")
	cfg.CheckDuration = time.Second
	if cfg.Quick {
		cfg.Duration = 250 * time.Millisecond
		cfg.Repeats = 1
		cfg.CheckDuration = 250 * time.Millisecond
	}
	return cfg, cfg.validate()
}

func (c config) validate() error {
	switch {
	case c.Docs != "" || c.DocsCheck != "":
		return nil
	case c.DSN == "":
		return errors.New("-dsn is required, e.g. -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'")
	case c.Duration <= 0:
		return fmt.Errorf("-duration must be > 0, got %v", c.Duration)
	case c.Repeats < 1:
		return fmt.Errorf("-repeat must be at least 1, got %d", c.Repeats)
	case len(c.Clients) == 0:
		return errors.New("-clients needs at least one client count, e.g. -clients 1,8,32")
	case c.MySQL != "" && len(c.MySQLClients) == 0:
		return errors.New("-mysql-clients needs at least one client count, e.g. -mysql-clients 1,8,32 (or leave -mysql out)")
	case c.SQLite && len(c.SQLiteClients) == 0:
		return errors.New("-sqlite-clients needs at least one client count, e.g. -sqlite-clients 1,8 (or pass -sqlite=false)")
	case c.Redis == "" && c.Subjects != nil && (slices.Contains(c.Subjects, implRedis) || slices.Contains(c.Subjects, implRedisRate) ||
		slices.Contains(c.Subjects, implRedisSemaphore)):
		return errors.New("-subjects lists redis, redis_rate or redis/semaphore, but -redis= leaves Redis out: pass -redis 127.0.0.1:6379, or leave them out of -subjects")
	}
	return nil
}

// subjectNames are the implementations -subjects may name.
var subjectNames = []string{implNone, implFloor, implTxlimit, implTxlimitSQL, implShards16, implCommit, implCommitLease, implBatch, implRedis, implRedisRate,
	implSlot, implRedisSemaphore}

// parseSubjects parses -subjects: "" is every subject (nil).
func parseSubjects(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(subjectNames, f) {
			return nil, fmt.Errorf("-subjects: unknown subject %q; name some of %s, comma-separated", f, strings.Join(subjectNames, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-subjects %q names no subject; name some of %s, or leave the flag out for all", s, strings.Join(subjectNames, ", "))
	}
	return out, nil
}

// wants reports whether the run measures the implementation name.
func (c config) wants(name string) bool {
	return c.Subjects == nil || slices.Contains(c.Subjects, name)
}

// parseCounts parses a comma-separated list of integers in [lo, hi], sorted
// and without duplicates.
func parseCounts(flagName, s string, lo, hi int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%s: %q is not a whole number between %d and %d", flagName, f, lo, hi)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// redactDSN hides the value of -dsn, which may hold a password, from the
// command line recorded in the results.
func redactDSN(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		switch {
		case a == "-dsn" || a == "--dsn":
			if i+1 < len(out) {
				out[i+1] = "…"
			}
		case strings.HasPrefix(a, "-dsn=") || strings.HasPrefix(a, "--dsn="):
			out[i] = a[:strings.IndexByte(a, '=')+1] + "…"
		}
	}
	return out
}
