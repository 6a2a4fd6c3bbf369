package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/mysqlstore"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// These tests run the command through run, as main does, against a SQLite
// file, a PostgreSQL schema and a MySQL or MariaDB database of their own
// (TEST_DATABASE_URL and TEST_MYSQL_DSN, else the local servers
// DEVELOPERS.md sets up; without one they skip, saying so, except under
// CI=true, where they fail).

const localDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// txlimitCmd runs the command line args and returns its exit status,
// stdout and stderr.
func txlimitCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// ok runs args, requires exit status 0 and nothing on stderr but the line
// naming the store the DSN selected, and returns stdout.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := txlimitCmd(t, args...)
	require.Equal(t, exitOK, code, "txlimit %q: %s", args, stderr)
	if !slices.Contains(args, "-help") && !slices.Contains(args, "--help") && !slices.Contains(args, "-h") && !slices.Contains(args, "help") {
		require.Regexp(t, `\Atxlimit: (pgstore|mysqlstore|sqlitestore): [^\n]+\n\z`, stderr)
	} else {
		require.Empty(t, stderr)
	}
	return stdout
}

// fails runs args, requires exit status code, and returns stderr.
func fails(t *testing.T, code int, args ...string) string {
	t.Helper()
	got, stdout, stderr := txlimitCmd(t, args...)
	require.Equal(t, code, got, "txlimit %q: stdout %s, stderr %s", args, stdout, stderr)
	require.NotEmpty(t, stderr)
	return stderr
}

func TestUsage(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLitePath(t)
	for _, help := range [][]string{{"-help"}, {"--help"}, {"-h"}, {"help"}, {"value", "-help"}} {
		out := ok(t, help...)
		require.Contains(t, out, "Commands:")
		require.Contains(t, out, "Exit status: 0 done; 1 failed")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"list"}, `unknown command "list"`},
		{[]string{"value", "send", "-dsn", dsn}, "value takes two arguments, NAME KEY"},
		{[]string{"keys", "a", "b", "-dsn", dsn}, "keys takes at most one argument"},
		{[]string{"migrate", "sideways", "-dsn", dsn}, "migrate takes up, down or status"},
		{[]string{"migrate", "down", "-dsn", dsn}, "add -yes"},
		{[]string{"prune", "-rate", "3", "-dsn", dsn}, "for other commands use -config"},
		{[]string{"keys", "-bogus", "-dsn", dsn}, "flag provided but not defined: -bogus"},
		{[]string{"migrate", "status", "-dsn", ""}, "no database: give -dsn"},
		{[]string{"keys", "-n", "-1", "-dsn", dsn}, "-n must be 0 (all) or more"},
	} {
		stderr := fails(t, exitUsage, c.args...)
		require.Contains(t, stderr, c.want, "%q", c.args)
		require.Contains(t, stderr, "Run txlimit -help for usage.")
	}

	// A mistyped SQLite path is not created.
	require.Contains(t, fails(t, exitError, "migrate", "status", "-dsn", dsn), "no SQLite database at")
	_, err := os.Stat(dsn)
	require.ErrorIs(t, err, os.ErrNotExist)

	// Configs are checked, naming the field and the fix.
	ok(t, "migrate", "up", "-dsn", dsn)
	bad := filepath.Join(t.TempDir(), "bad.json")
	for _, c := range []struct {
		args []string
		file string
		want string
	}{
		{[]string{"value", "send", "k"}, "", `no config for limit "send"`},
		{[]string{"value", "send", "k", "-kind", "token_bucket", "-rate", "3"}, "", "needs at least -kind, -rate and -period"},
		{[]string{"value", "send", "k", "-kind", "leaky", "-rate", "3", "-period", "1m"}, "", "flag -kind must be token_bucket, fixed_window, sliding_window, daily, weekly, monthly or yearly"},
		{[]string{"value", "send", "k", "-kind", "leaky", "-rate", "3"}, "", "flag -kind must be token_bucket"},
		{[]string{"value", "send", "k", "-kind", "token_bucket", "-rate", "-3", "-period", "1m"}, "", "Rate"},
		{[]string{"value", "send", "k", "-kind", "token_bucket", "-rate", "3", "-period", "1m", "-start", "2026-01-01T00:00:00Z"}, "", "Start"},
		{[]string{"prune"}, "", "prune needs your limits' configs"},
		{[]string{"prune", "-config", bad}, `{"send": {"kind": "token_bucket", "rate": 1, "period": "1 minute"}}`, `limit "send": period must be a Go duration`},
		{[]string{"prune", "-config", bad}, `{"send": {"kind": "token_bucket", "rate": 1, "period": "1m", "burst": 3}}`, `unknown field "burst"`},
		{[]string{"keys", "-config", bad}, `{"send": {"kind": "fixed_window", "rate": 1, "period": "1m", "shards": 5000}}`, "Shards"},
		// The window shapes: the command reads the fields, txlimit.New
		// judges them, and the operator is told which flag or field.
		{[]string{"value", "send", "k", "-kind", "fixed_window", "-rate", "3"}, "", "needs at least -kind, -rate and -period (a calendar kind, daily, weekly, monthly or yearly, takes -zone instead"},
		{[]string{"value", "send", "k", "-kind", "weekly", "-rate", "3", "-zone", "UTC", "-week-start", "funday"}, "", "flag -week-start must be a day of the week"},
		{[]string{"value", "send", "k", "-kind", "sliding_window", "-rate", "3", "-period", "1m", "-zone", "UTC"}, "", "flag -zone: Zone applies to the calendar kinds (Daily, Weekly, Monthly, Yearly), not to a SlidingWindow"},
		{[]string{"value", "send", "k", "-kind", "monthly", "-rate", "3", "-period", "1m", "-zone", "UTC"}, "", "flag -period: Period must be 0 for a Monthly limit"},
		{[]string{"value", "send", "k", "-kind", "daily", "-rate", "3"}, "", `flag -zone: Zone is required for a Daily limit, whose windows start at midnight in that zone: say "UTC" for UTC`},
		{[]string{"value", "send", "k", "-kind", "daily", "-rate", "3", "-zone", "Mars/Olympus"}, "", `flag -zone: Zone "Mars/Olympus" is not a time zone`},
		{[]string{"value", "send", "k", "-kind", "daily", "-rate", "3", "-zone", "UTC", "-week-start", "monday"}, "", "flag -week-start: WeekStart applies to Weekly limits only"},
		{[]string{"value", "send", "k", "-kind", "daily", "-rate", "3", "-zone", "UTC", "-start", "2026-01-01T00:00:00Z"}, "", "flag -start: Start aligns windows of Period"},
		// The calendar of a fixed window, before calendar windows were
		// kinds: refused, naming the kind to give.
		{[]string{"value", "send", "k", "-kind", "fixed_window", "-rate", "3", "-calendar", "month"}, "", "flag -calendar is gone: a calendar window is a kind of its own; give flag -kind monthly and its flag -zone (UTC included)"},
		{[]string{"value", "send", "k", "-kind", "fixed_window", "-rate", "3", "-calendar", "fortnight"}, "", "give flag -kind daily, weekly, monthly or yearly"},
		{[]string{"keys", "-config", bad}, `{"api": {"kind": "fixed_window", "rate": 1, "calendar": "week", "zone": "UTC"}}`, `limit "api": calendar is gone: a calendar window is a kind of its own; give`},
		{[]string{"keys", "-config", bad}, `{"login": {"kind": "sliding-window", "rate": 1}}`, `limit "login": period: Period must be at least 1µs, got 0s`},
		{[]string{"keys", "-config", bad}, `{"api": {"kind": "monthly", "rate": 1, "zone": "Local"}}`, `limit "api": zone: Zone must name a zone`},
		{[]string{"keys", "-config", bad}, `{"api": {"kind": "monthly", "rate": 1}}`, `limit "api": zone: Zone is required for a Monthly limit`},
		{[]string{"keys", "-config", bad}, `{"w": {"kind": "weekly", "rate": 1, "zone": "UTC", "week_start": "Funday"}}`, `limit "w": week_start must be a day of the week`},
		{[]string{"keys", "-config", bad}, `{"x": {"kind": "leaky", "rate": 1, "period": "1m"}}`, `limit "x": kind must be token_bucket, fixed_window, sliding_window, daily, weekly, monthly or yearly`},
	} {
		if c.file != "" {
			require.NoError(t, os.WriteFile(bad, []byte(c.file), 0o600))
		}
		stderr := fails(t, exitUsage, append(c.args, "-dsn", dsn)...)
		require.Contains(t, stderr, c.want, "%q", c.args)
	}
	require.Contains(t, fails(t, exitError, "prune", "-dsn", dsn, "-config", filepath.Join(t.TempDir(), "missing.json")), "no such file")

	// A calendar window by flags, on a key with no row.
	out := ok(t, "value", "api", "acme", "-dsn", dsn, "-kind", "Daily", "-rate", "3", "-zone", "UTC")
	require.Contains(t, out, "limit api, key acme: fixed window, 3 per calendar day in UTC, capacity 3, 1 shard(s)")
	require.Regexp(t, `(?m)^0\s+3\s+-\s+\(no row: full\)$`, out)
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	exercise(t, path, func(t *testing.T) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiter(t, sqlitestore.New(db))
	})
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := postgresDSN(t)
	exercise(t, dsn, func(t *testing.T) *txlimit.Limiter[pgx.Tx] {
		pool, err := pgxpool.New(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return newLimiter(t, pgstore.New(pool))
	})
}

// TestMySQL runs every command on a database of the test's own on the MySQL
// or MariaDB server of TEST_MYSQL_DSN (else the local one), given as a
// go-sql-driver/mysql DSN without the parameters mysqlstore needs: the
// command sets them.
func TestMySQL(t *testing.T) {
	t.Parallel()
	cfg := mysqltest.EmptyDatabase(t)
	bare := cfg.Clone()
	bare.ParseTime, bare.InterpolateParams = false, false
	dsn := bare.FormatDSN()
	require.Equal(t, mysqlStore, storeOf(dsn), dsn)

	// The mysql:// form names the same database.
	u := "mysql://" + cfg.User + "@" + cfg.Addr + "/" + cfg.DBName
	if cfg.Passwd != "" {
		u = "mysql://" + cfg.User + ":" + cfg.Passwd + "@" + cfg.Addr + "/" + cfg.DBName
	}
	code, _, stderr := txlimitCmd(t, "migrate", "status", "-dsn", u)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, fmt.Sprintf("txlimit: mysqlstore: MySQL or MariaDB at %s, database %s\n", cfg.Addr, cfg.DBName), stderr)

	exercise(t, dsn, func(t *testing.T) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("mysql", cfg.FormatDSN()) // with the store's parameters
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiter(t, mysqlstore.New(db))
	})
}

func TestStoreOf(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://app@db:5432/app":                   postgresStore,
		"postgresql://app@db/app?search_path=s":        postgresStore,
		"mysql://app:secret@db:3306/app":               mysqlStore,
		"app:secret@tcp(db:3306)/app":                  mysqlStore,
		"app:p@ss@tcp(db:3306)/app?parseTime=true":     mysqlStore,
		"root@unix(/run/mysqld/mysqld.sock)/app":       mysqlStore,
		"tcp(127.0.0.1:3306)/app":                      mysqlStore,
		"app.db":                                       sqliteStore,
		"/var/lib/app/app.db":                          sqliteStore,
		"file:app.db?_pragma=busy_timeout(5000)":       sqliteStore,
		"root:@tcp(127.0.0.1:3306)/test?loc=UTC&x=y/z": mysqlStore,
	} {
		require.Equal(t, want, storeOf(dsn), dsn)
	}
	for dsn, want := range map[string]string{
		"mysql://app:secret@db/app?loc=UTC": "app:secret@tcp(db:3306)/app?",
		"mysql://root@127.0.0.1:3307/test":  "root@tcp(127.0.0.1:3307)/test?",
	} {
		cfg, err := mysqlConfig(dsn)
		require.NoError(t, err, dsn)
		require.True(t, cfg.ParseTime && cfg.InterpolateParams, "the parameters mysqlstore needs")
		require.True(t, strings.HasPrefix(cfg.FormatDSN(), want), "%s: %s", dsn, cfg.FormatDSN())
	}
}

// postgresDSN returns the DSN of a schema of the test's own on the test
// server, dropped when the test ends.
func postgresDSN(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), localDatabaseURL)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("SKIPPING PostgreSQL tests: no server at %s: %v (set TEST_DATABASE_URL or start a local server)", url, err)
	}
	defer admin.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "txlimit_test_" + hex.EncodeToString(b)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			_ = conn.Close(context.Background())
		}
	})
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// start aligns the windows of "send" so that none ends during a test:
// within a window a fixed window refills nothing, and every number is exact.
var start = time.Now().Add(-time.Hour).UTC()

// The limits of the application under test, and the same as the command's
// -config file. "gone" is in the database but not in the file.
var limits = map[string]txlimit.Config{
	"send": {Kind: txlimit.FixedWindow, Rate: 10, Period: 365 * 24 * time.Hour, Start: start, Shards: 2},
	"tb":   {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour, Shards: 4},
	"gone": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
}

func configFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.json")
	data := `{
		"send": {"kind": "fixed_window", "rate": 10, "period": "8760h", "start": "` + start.Format(time.RFC3339Nano) + `", "shards": 2},
		"tb": {"kind": "token_bucket", "rate": 5, "period": "1h", "shards": 4}
	}`
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	return path
}

func newLimiter[TTx any](t *testing.T, store driver.Store[TTx]) *txlimit.Limiter[TTx] {
	t.Helper()
	l, err := txlimit.New(store, limits, nil)
	require.NoError(t, err)
	return l
}

func keysJSON(t *testing.T, args ...string) keysOutput {
	t.Helper()
	var out keysOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, append([]string{"keys", "-json"}, args...)...)), &out))
	return out
}

func names(out keysOutput) []string {
	var s []string
	for _, k := range out.Keys {
		s = append(s, k.Name+"/"+k.Key)
	}
	return s
}

// exercise runs every command on the database dsn, where the application's
// Limiter (from open, once the table exists) spends tokens.
func exercise[TTx any](t *testing.T, dsn string, open func(*testing.T) *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	config := configFile(t)

	// migrate
	out := ok(t, "migrate", "up", "-dsn", dsn)
	require.Contains(t, out, "applied 00001_create_txlimit.sql")
	// SQLite adds the sliding window's prev column in its second
	// migration; MySQL's first creates the table with it; PostgreSQL has
	// escrow mode's tables (since dropped) and the arithmetic's functions
	// before it, the function a take at commit raises with, the table's
	// fillfactor, the shard checks' removal, the escrow tables' drop and
	// the shards column after it. Then txlimit_holder, the holders of
	// concurrency limits, everywhere, then the pauses' column, and last
	// txlimit_idempotency, the keys of idempotent takes.
	holders, paused, last := 3, 4, 5
	switch storeOf(dsn) {
	case mysqlStore:
		holders, paused, last = 2, 3, 4
	case postgresStore:
		holders, paused, last = 10, 11, 12
		require.Contains(t, out, "applied 00002_create_txlimit_escrow.sql")
		require.Contains(t, out, "applied 00003_create_txlimit_functions.sql")
		require.Contains(t, out, "applied 00004_add_txlimit_prev.sql")
		require.Contains(t, out, "applied 00005_create_txlimit_deny.sql")
		require.Contains(t, out, "applied 00006_set_txlimit_fillfactor.sql")
		require.Contains(t, out, "applied 00007_drop_txlimit_shard_checks.sql")
		require.Contains(t, out, "applied 00008_drop_txlimit_escrow.sql")
		require.Contains(t, out, "applied 00009_lean_takes.sql")
	}
	require.Contains(t, out, fmt.Sprintf("applied %05d_create_txlimit_holder.sql", holders))
	require.Contains(t, out, fmt.Sprintf("applied %05d_create_txlimit_idempotency.sql", last))
	require.Contains(t, out, fmt.Sprintf("applied %05d_add_txlimit_paused_until.sql", paused))
	require.Contains(t, out, fmt.Sprintf("version %d (recorded in txlimit_goose_version)", last))
	require.Contains(t, ok(t, "migrate", "up", "-dsn", dsn), "up to date: nothing to apply")
	require.Regexp(t, `1\s+applied\s+\d{4}-\d\d-\d\dT.*00001_create_txlimit.sql`, ok(t, "migrate", "status", "-dsn", dsn))

	// The application spends tokens.
	l := open(t)
	take := func(name, key string, n float64) {
		res, err := l.Limit(ctx, name, key, txlimit.Count(n))
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	take("send", "alice", 3)
	take("send", "bob", 1)
	take("send", "carol", 5)
	take("send", "carol", 5)
	take("tb", "dave", 2)
	take("gone", "x y", 1)

	// value: per shard and total, as text and JSON.
	out = ok(t, "value", "send", "alice", "-dsn", dsn, "-kind", "fixed_window", "-rate", "10", "-period", "8760h",
		"-start", start.Format(time.RFC3339Nano), "-shards", "2")
	require.Contains(t, out, "limit send, key alice: fixed window, 10 per 8760h0m0s, capacity 10, 2 shard(s)")
	require.Contains(t, out, "WINDOW START")
	require.Regexp(t, `TOTAL\s+7\s+of 10`, out)
	for name, key := range map[string]string{"send": "alice", "tb": "dave"} {
		var v valueOutput
		require.NoError(t, json.Unmarshal([]byte(ok(t, "value", name, key, "-dsn", dsn, "-config", config, "-json")), &v))
		require.Len(t, v.Shards, limits[name].Shards)
		var sum float64
		rows := 0
		for _, s := range v.Shards {
			sum += s.Now
			if s.Row {
				rows++
				require.NotNil(t, s.TS)
			} else {
				require.Equal(t, limits[name].Rate/float64(limits[name].Shards), s.Now, "a missing shard is full")
			}
		}
		require.Positive(t, rows)
		// The shards, projected by the command, add up to what
		// Limiter.CheckTx says in the same transaction.
		require.InDelta(t, v.Total, sum, 1e-9, "%s %s", name, key)
		read, err := l.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		if name == "send" {
			require.Equal(t, 7.0, v.Total)
			require.Equal(t, 7.0, read.Remaining)
		} else { // a token bucket refills while the test runs
			require.InDelta(t, 3, v.Total, 0.01)
			require.GreaterOrEqual(t, read.Remaining, v.Total)
		}
	}

	// keys: emptiest first; a limit without a config last.
	all := keysJSON(t, "-dsn", dsn, "-config", config)
	require.Equal(t, []string{"send/carol", "tb/dave", "send/alice", "send/bob", "gone/x y"}, names(all))
	require.Equal(t, 5, all.Total)
	require.Equal(t, 0.0, all.Keys[0].Tokens)
	require.Equal(t, 0.7, all.Keys[2].Fill)
	require.False(t, all.Keys[4].Configured)
	require.Equal(t, 0.0, all.Keys[4].Stored)
	some := keysJSON(t, "send", "-dsn", dsn, "-config", config, "-n", "2")
	require.Equal(t, []string{"send/carol", "send/alice"}, names(some))
	require.Equal(t, 3, some.Total)
	out = ok(t, "keys", "-dsn", dsn, "-config", config)
	require.Regexp(t, `(?m)^LIMIT\s+KEY\s+TOKENS NOW\s+CAPACITY\s+FULL\s+ROWS$`, out)
	require.Regexp(t, `(?m)^send\s+carol\s+0\s+10\s+0%\s+\d$`, out)
	require.Regexp(t, `(?m)^gone\s+"x y"\s+\?\s+\?\s+\?\s+1$`, out)
	require.Contains(t, out, "5 key(s) with state, 5 shown")
	require.Contains(t, out, "1 of limits with no config (?)")
	// The config flags stand for the NAME of keys NAME.
	some = keysJSON(t, "send", "-dsn", dsn, "-kind", "fixed_window", "-rate", "10", "-period", "8760h", "-start", start.Format(time.RFC3339Nano), "-shards", "2")
	require.Equal(t, []string{"send/carol", "send/alice", "send/bob"}, names(some))

	// reset
	require.Regexp(t, `limit send, key carol: deleted \d row\(s\); the limit is full again`, ok(t, "reset", "send", "carol", "-dsn", dsn))
	require.Contains(t, ok(t, "reset", "send", "carol", "-dsn", dsn), "had no state: nothing to reset")
	require.Contains(t, ok(t, "reset", "gone", "x y", "-dsn", dsn), "deleted 1 row(s)")
	read, err := l.Check(ctx, "send", "carol", txlimit.Count(0))
	require.NoError(t, err)
	require.Equal(t, 10.0, read.Remaining)
	require.Contains(t, fails(t, exitUsage, "reset", "send", "bad\x00key", "-dsn", dsn), "key")

	// prune: bob is full again once credited; alice and dave are not.
	require.NoError(t, l.Credit(ctx, "send", "bob", 1))
	take("gone", "y", 1)
	out = ok(t, "prune", "-dsn", dsn, "-config", config, "-batch", "1")
	require.Regexp(t, `deleted \d row\(s\); examined 4 key\(s\) in \d transaction\(s\); kept 1 key\(s\) of limits not in the config`, out)
	require.Equal(t, []string{"tb/dave", "send/alice", "gone/y"}, names(keysJSON(t, "-dsn", dsn, "-config", config)))

	exerciseHolders(t, dsn, l)
	exercisePause(t, dsn, config, l)

	// migrate down drops the table; the commands that read it then fail.
	// Down to the first migration (the versions may have gaps).
	for i := 0; !strings.Contains(ok(t, "migrate", "down", "-yes", "-dsn", dsn), "rolled back 00002_"); i++ {
		require.Less(t, i, last, "migrate down never rolled back 00002")
	}
	if storeOf(dsn) != mysqlStore { // MySQL's first migration has prev
		// The table is there without prev: the commands say how to fix it.
		require.Contains(t, fails(t, exitError, "keys", "-dsn", dsn, "-config", config), "txlimit migrate up applies the missing migrations")
		require.Contains(t, fails(t, exitError, "value", "send", "alice", "-dsn", dsn, "-config", config), "txlimit migrate up applies the missing migrations")
	}
	out = ok(t, "migrate", "down", "-yes", "-dsn", dsn)
	require.Contains(t, out, "rolled back 00001_create_txlimit.sql")
	require.Contains(t, out, "version 0")
	require.Contains(t, ok(t, "migrate", "down", "-yes", "-dsn", dsn), "nothing to roll back")
	require.Contains(t, ok(t, "migrate", "status", "-dsn", dsn), "pending")
	fails(t, exitError, "keys", "-dsn", dsn)
}

func TestDashKey(t *testing.T) {
	t.Parallel()
	dsn := testdb.SQLitePath(t)
	ok(t, "migrate", "up", "-dsn", dsn)
	require.Contains(t, ok(t, "reset", "-dsn", dsn, "send", "--", "-x"), "limit send, key -x had no state")
	require.Contains(t, ok(t, "value", "send", "-dsn", dsn, "-kind", "token_bucket", "-rate", "2", "-period", "1s", "--", ""), `key "": token bucket, 2 per 1s`)
}
