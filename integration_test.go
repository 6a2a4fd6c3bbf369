package txlimit_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also registers the database/sql driver "pgx"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // registers the database/sql driver "sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
	"github.com/txlimit/txlimit/txlimittest"
)

// TestIntegration is the README run as an application runs it, end to end,
// on every database CI provides: PostgreSQL through pgx (pgstore) and
// through database/sql (pgsqlstore on pgx's stdlib driver), MySQL/MariaDB
// (mysqlstore on go-sql-driver/mysql) and SQLite (sqlitestore on
// modernc.org/sqlite). Each gets a fresh schema or database and walks one
// application's life (appFlow): its own goose migrations, a Limiter on a
// database where txlimit's were forgotten, migrations.Up, limits inside its
// own transactions with its own writes, several limits at once, a
// reservation whose work a small scheduler runs as a job, the cancel that
// credits it back, the take at commit, and Prune. Under CI=true a missing
// PostgreSQL or MariaDB fails the test (testdb, mysqltest), never skips it.
func TestIntegration(t *testing.T) {
	t.Parallel()
	t.Run("postgres_pgx", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t, testdb.EmptySchema(t), pgx.QueryExecModeCacheStatement, 4)
		db := stdlib.OpenDBFromPool(pool) // goose runs on database/sql
		t.Cleanup(func() { _ = db.Close() })
		appFlow(t, &appDB[pgx.Tx]{
			dialect: migrations.Postgres, goose: goose.DialectPostgres, db: db,
			newLimiter: func(limits map[string]txlimit.Config, opts *txlimit.Options) (*txlimit.Limiter[pgx.Tx], error) {
				return txlimit.New(pgstore.New(pool), limits, opts)
			},
			begin: func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
			exec: func(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
				tag, err := tx.Exec(ctx, dollars(query), args...)
				return tag.RowsAffected(), err
			},
			commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		})
	})
	t.Run("postgres_database_sql", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(testdb.URL(t))
		require.NoError(t, err)
		q := u.Query()
		q.Set("search_path", testdb.EmptySchema(t))
		u.RawQuery = q.Encode()
		db := openSQL(t, "pgx", u.String())
		appFlow(t, sqlApp(db, migrations.Postgres, goose.DialectPostgres, pgsqlstore.New(db)))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		cfg := mysqltest.EmptyDatabase(t)
		// The DSN settings mysqlstore documents (EmptyDatabase sets them
		// too; said here as an application says them).
		cfg.ParseTime = true
		cfg.InterpolateParams = true
		db := openSQL(t, "mysql", cfg.FormatDSN())
		appFlow(t, sqlApp(db, migrations.MySQL, goose.DialectMySQL, mysqlstore.New(db)))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		// The DSN sqlitestore documents: wait for the write lock, WAL, and
		// BEGIN IMMEDIATE.
		db := openSQL(t, "sqlite", "file:"+testdb.SQLitePath(t)+
			"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		appFlow(t, sqlApp(db, migrations.SQLite, goose.DialectSQLite3, sqlitestore.New(db)))
	})
}

// The application's limits.
var appLimits = map[string]txlimit.Config{
	// 3 messages a minute per user: a token every 20 s.
	"sendMessage": {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Minute},
	// 5 messages an hour per workspace, in windows starting on the hour.
	"workspaceMessages": {Kind: txlimit.FixedWindow, Rate: 5, Period: time.Hour, Start: appT0},
	// One export every 10 s per user; up to 3 more reserved ahead, each run
	// as a job when its token exists.
	"export": {Kind: txlimit.TokenBucket, Rate: 1, Period: 10 * time.Second, MaxReserved: 3},
}

// appT0 is where the test clock starts, on the hour.
var appT0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// appMigrations is the application's own goose history, beside which
// migrations.Up keeps txlimit's in a version table of its own. One text
// for every dialect.
var appMigrations = fstest.MapFS{"00001_app.sql": {Data: []byte(`-- +goose Up
CREATE TABLE messages (user_id VARCHAR(64) NOT NULL, workspace VARCHAR(64) NOT NULL, body VARCHAR(256) NOT NULL);
CREATE TABLE jobs (id VARCHAR(64) PRIMARY KEY, user_id VARCHAR(64) NOT NULL, tokens DOUBLE PRECISION NOT NULL,
    run_at BIGINT NOT NULL, state VARCHAR(16) NOT NULL, ran_at BIGINT);
CREATE TABLE exports (job_id VARCHAR(64) PRIMARY KEY, done_at BIGINT NOT NULL);
-- +goose Down
DROP TABLE exports;
DROP TABLE jobs;
DROP TABLE messages;
`)}}

// appFlow is one application's life on a, a fresh schema or database,
// step by step; it stops at the first step that fails fatally (require),
// since each builds on the state the ones before left. Every clock reading is the test clock's,
// so every token count and RetryAfter is exact.
func appFlow[TTx any](t *testing.T, a *appDB[TTx]) {
	ctx := context.Background()
	clock := txlimittest.NewClock(appT0)
	l, err := a.newLimiter(appLimits, &txlimit.Options{Clock: clock.Now})
	require.NoError(t, err)

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"the application's own migrations", func(t *testing.T) {
			p, err := goose.NewProvider(a.goose, a.db, appMigrations)
			require.NoError(t, err)
			_, err = p.Up(ctx)
			require.NoError(t, err)
		}},

		{"not migrated: every call names migrations.Up", func(t *testing.T) {
			notMigrated := func(what string, err error) {
				t.Helper()
				require.ErrorIs(t, err, txlimit.ErrNotMigrated, what)
				// Once, not repeated by a store that wraps its own error
				// again (issue 35). Not fatal: the steps after this one do
				// not depend on it.
				if n := strings.Count(err.Error(), "migrations.Up"); n != 1 {
					t.Errorf("%s: the error names migrations.Up %d times, not once: %v", what, n, err)
				}
			}
			notMigrated("Ping", l.Ping(ctx))
			_, err := l.Limit(ctx, "sendMessage", "alice")
			notMigrated("Limit", err)
			tx := a.beginTx(t)
			_, err = l.LimitTx(ctx, tx, "sendMessage", "alice")
			notMigrated("LimitTx", err)
			require.NoError(t, a.rollback(ctx, tx))
		}},

		{"migrations.Up at setup", func(t *testing.T) {
			require.NoError(t, migrations.Up(ctx, a.db, a.dialect))
			require.NoError(t, l.Ping(ctx))
			fsys, err := migrations.FS(a.dialect)
			require.NoError(t, err)
			files, err := fs.Glob(fsys, "*.sql")
			require.NoError(t, err)
			require.NotEmpty(t, files)
			// Each history in its own table: txlimit's every file, the
			// application's its one.
			require.Equal(t, len(files), a.count(t, "SELECT COUNT(*) FROM "+migrations.VersionTable+" WHERE version_id > 0 AND is_applied"))
			require.Equal(t, 1, a.count(t, "SELECT COUNT(*) FROM goose_db_version WHERE version_id > 0 AND is_applied"))
			// Up again is a no-op.
			require.NoError(t, migrations.Up(ctx, a.db, a.dialect))
			require.Equal(t, len(files), a.count(t, "SELECT COUNT(*) FROM "+migrations.VersionTable+" WHERE version_id > 0 AND is_applied"))
		}},

		{"a limit in the application's transaction: commit spends, a denial writes nothing", func(t *testing.T) {
			for i, left := range []float64{2, 1, 0} {
				res, err := a.sendMessage(ctx, l, "alice", "home", fmt.Sprint("hello ", i))
				require.NoError(t, err)
				require.True(t, res.OK)
				require.Equal(t, 0*time.Second, res.RetryAfter)
				require.Equal(t, left, res.Remaining)
				require.True(t, res.At.Equal(appT0), "decided at the test clock's reading, not %v", res.At)
			}
			res, err := a.sendMessage(ctx, l, "alice", "home", "one too many")
			require.False(t, res.OK)
			require.Equal(t, 20*time.Second, res.RetryAfter, "the next token comes in 20 s")
			require.Equal(t, 0.0, res.Remaining)
			var rl *txlimit.RateLimitedError
			require.ErrorAs(t, err, &rl)
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
			require.Equal(t, txlimit.RateLimitedError{Name: "sendMessage", Key: "alice", RetryAfter: 20 * time.Second}, *rl)
			require.Equal(t, 3, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "alice"))
			require.Equal(t, 0.0, a.remaining(t, l, "sendMessage", "alice"))
		}},

		{"rollback returns the token and leaves no row", func(t *testing.T) {
			_, err := a.sendMessage(ctx, l, "bob", "home", "kept")
			require.NoError(t, err)
			require.Equal(t, 2.0, a.remaining(t, l, "sendMessage", "bob"))

			tx := a.beginTx(t)
			res, err := l.LimitTx(ctx, tx, "sendMessage", "bob")
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, 1.0, res.Remaining)
			_, err = a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", "bob", "home", "rolled back")
			require.NoError(t, err)
			in, err := l.CheckTx(ctx, tx, "sendMessage", "bob", txlimit.Count(0))
			require.NoError(t, err)
			require.Equal(t, 1.0, in.Remaining, "inside the transaction the token is taken")
			require.NoError(t, a.rollback(ctx, tx))

			require.Equal(t, 2.0, a.remaining(t, l, "sendMessage", "bob"), "the rollback gave the token back")
			require.Equal(t, 1, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "bob"))
		}},

		{"tokens refill with the clock", func(t *testing.T) {
			clock.Advance(20 * time.Second)
			require.Equal(t, 1.0, a.remaining(t, l, "sendMessage", "alice"))
			res, err := a.sendMessage(ctx, l, "alice", "home", "after 20 s")
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, 0.0, res.Remaining)
			require.Equal(t, 4, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "alice"))
		}},

		{"several limits at once: all or none", func(t *testing.T) {
			// appT0+20s. A grant rolled back gives back both limits' tokens.
			tx := a.beginTx(t)
			all, err := l.LimitAllTx(ctx, tx, messageLimits("erin", "acme")...)
			require.NoError(t, err)
			require.True(t, all.OK)
			require.Equal(t, []float64{2, 4}, remainings(all))
			require.NoError(t, a.rollback(ctx, tx))
			require.Equal(t, 3.0, a.remaining(t, l, "sendMessage", "erin"))
			require.Equal(t, 5.0, a.remaining(t, l, "workspaceMessages", "acme"))

			for _, s := range []struct {
				user string
				left []float64
			}{
				{"dave", []float64{2, 4}}, {"dave", []float64{1, 3}}, {"dave", []float64{0, 2}},
				{"erin", []float64{2, 1}}, {"erin", []float64{1, 0}},
			} {
				all, err := a.sendWorkspaceMessage(ctx, l, s.user, "acme")
				require.NoError(t, err)
				require.True(t, all.OK)
				require.Equal(t, s.left, remainings(all), s.user)
			}
			// The workspace is spent; erin alone is not: nothing is taken.
			all, err = a.sendWorkspaceMessage(ctx, l, "erin", "acme")
			require.False(t, all.OK)
			wait := time.Hour - 20*time.Second // the next window starts on the hour
			require.Equal(t, wait, all.RetryAfter)
			require.Len(t, all.Results, 2)
			require.True(t, all.Results[0].OK, "erin's own limit would grant")
			require.Equal(t, 1.0, all.Results[0].Remaining)
			require.False(t, all.Results[1].OK)
			require.Equal(t, wait, all.Results[1].RetryAfter)
			var rl *txlimit.RateLimitedError
			require.ErrorAs(t, err, &rl)
			require.Equal(t, txlimit.RateLimitedError{Name: "workspaceMessages", Key: "acme", RetryAfter: wait}, *rl)
			require.Equal(t, 1.0, a.remaining(t, l, "sendMessage", "erin"), "all or none: erin's token was not taken")
			require.Equal(t, 0.0, a.remaining(t, l, "workspaceMessages", "acme"))
			require.Equal(t, 5, a.count(t, "SELECT COUNT(*) FROM messages WHERE workspace = ?", "acme"))
		}},

		{"reservations scheduled as jobs; a cancel credits its tokens back", func(t *testing.T) {
			// appT0+20s: one export now, three reserved 10 s apart.
			for i, want := range []struct {
				retryAfter time.Duration
				remaining  float64
			}{{0, 0}, {10 * time.Second, -1}, {20 * time.Second, -2}, {30 * time.Second, -3}} {
				res, err := a.requestExport(ctx, l, fmt.Sprint("export-", i+1), "frank")
				require.NoError(t, err)
				require.True(t, res.OK)
				require.Equal(t, want.retryAfter, res.RetryAfter)
				require.Equal(t, want.remaining, res.Remaining)
			}
			// A fourth reservation would exceed MaxReserved: denied, no job.
			res, err := a.requestExport(ctx, l, "export-5", "frank")
			require.ErrorIs(t, err, txlimit.ErrRateLimited)
			require.False(t, res.OK)
			require.Equal(t, 10*time.Second, res.RetryAfter, "when the debt leaves room for one more")
			require.Equal(t, -3.0, res.Remaining)
			require.Equal(t, 4, a.count(t, "SELECT COUNT(*) FROM jobs WHERE state = 'scheduled'"))

			// The user cancels the last export before it runs: its tokens come
			// back once, in the transaction that cancels the job.
			require.True(t, a.cancelExport(t, l, "export-4"))
			require.Equal(t, -2.0, a.remaining(t, l, "export", "frank"))
			require.False(t, a.cancelExport(t, l, "export-4"), "cancelled already: no second credit")
			require.Equal(t, -2.0, a.remaining(t, l, "export", "frank"))

			// The credit makes room: the next reservation waits 30 s, as the
			// cancelled one did.
			res, err = a.requestExport(ctx, l, "export-5", "frank")
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, 30*time.Second, res.RetryAfter)
			require.Equal(t, -3.0, res.Remaining)

			// The scheduler runs every 5 s of the test clock; each job runs at
			// its run_at (res.At + res.RetryAfter), without the limiter.
			ran := map[time.Duration][]string{}
			for tick := 0; a.count(t, "SELECT COUNT(*) FROM jobs WHERE state = 'scheduled'") > 0; tick++ {
				require.Less(t, tick, 10, "the jobs should have run by appT0+70s")
				if ids := a.runDueJobs(t, clock.Now()); len(ids) > 0 {
					ran[clock.Now().Sub(appT0)] = ids
				}
				clock.Advance(5 * time.Second)
			}
			require.Equal(t, map[time.Duration][]string{
				20 * time.Second: {"export-1"},
				30 * time.Second: {"export-2"},
				40 * time.Second: {"export-3"},
				50 * time.Second: {"export-5"},
			}, ran)
			require.Equal(t, 4, a.count(t, "SELECT COUNT(*) FROM exports"))
			require.Equal(t, 4, a.count(t, "SELECT COUNT(*) FROM jobs WHERE state = 'done' AND ran_at = run_at"))
			require.Equal(t, 1, a.count(t, "SELECT COUNT(*) FROM jobs WHERE id = 'export-4' AND state = 'cancelled' AND ran_at IS NULL"))
			// The last reserved token exists now, appT0+55s, and nothing more.
			require.Equal(t, appT0.Add(55*time.Second), clock.Now())
			require.Equal(t, 0.5, a.remaining(t, l, "export", "frank"))
		}},

		{"the take at commit", func(t *testing.T) {
			// appT0+55s. fn's error rolls back and takes nothing.
			errNoRecipient := errors.New("no such recipient")
			_, err := l.Commit(ctx, func(tx TTx) error {
				if _, err := a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", "gina", "home", "to nobody"); err != nil {
					return err
				}
				return errNoRecipient
			}, txlimit.Request{Name: "sendMessage", Key: "gina"})
			require.ErrorIs(t, err, errNoRecipient)
			require.Equal(t, 3.0, a.remaining(t, l, "sendMessage", "gina"))
			require.Equal(t, 0, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "gina"))

			for _, left := range []float64{2, 1, 0} {
				all, err := a.sendAtCommit(ctx, l, "gina")
				require.NoError(t, err)
				require.True(t, all.OK)
				require.Equal(t, []float64{left}, remainings(all))
			}
			all, err := a.sendAtCommit(ctx, l, "gina")
			require.False(t, all.OK)
			require.Equal(t, 20*time.Second, all.RetryAfter)
			var rl *txlimit.RateLimitedError
			require.ErrorAs(t, err, &rl, "the denial is the error")
			require.Equal(t, txlimit.RateLimitedError{Name: "sendMessage", Key: "gina", RetryAfter: 20 * time.Second}, *rl)
			require.Equal(t, 3, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "gina"), "the denied commit left no row")

			// CommitTx ends a transaction the application began.
			for _, c := range []struct {
				user string
				ok   bool
				left float64
			}{{"hank", true, 2}, {"gina", false, 0}} {
				tx := a.beginTx(t)
				_, err := a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", c.user, "home", "at commit")
				require.NoError(t, err)
				all, err := l.CommitTx(ctx, tx, txlimit.Request{Name: "sendMessage", Key: c.user})
				require.Equal(t, c.ok, all.OK, c.user)
				require.Equal(t, c.ok, err == nil, "%s: %v", c.user, err)
				require.Equal(t, c.left, a.remaining(t, l, "sendMessage", c.user))
			}
			require.Equal(t, 1, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "hank"))
			require.Equal(t, 3, a.count(t, "SELECT COUNT(*) FROM messages WHERE user_id = ?", "gina"))
		}},

		{"Prune deletes the rows that are full again", func(t *testing.T) {
			// appT0+55s: one row per (name, key) written: sendMessage for alice,
			// bob, dave, erin, gina, hank; workspaceMessages for acme; export
			// for frank. Only bob's has refilled (2 at appT0, 3 by appT0+20s).
			require.Equal(t, 8, a.count(t, "SELECT COUNT(*) FROM txlimit"))
			res, err := l.Prune(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, txlimit.PruneResult{Deleted: 1, Keys: 8, Batches: 2, Complete: true}, res)
			require.Equal(t, 7, a.count(t, "SELECT COUNT(*) FROM txlimit"))
			require.Equal(t, 0, a.count(t, "SELECT COUNT(*) FROM txlimit WHERE name = ? AND "+a.keyColumn()+" = ?", "sendMessage", "bob"))
			require.Equal(t, 3.0, a.remaining(t, l, "sendMessage", "bob"), "a missing row is a full limit")

			// On the hour the workspace's window turns, and every limit is full.
			clock.Set(appT0.Add(time.Hour))
			res, err = l.Prune(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, txlimit.PruneResult{Deleted: 7, Keys: 7, Batches: 2, Complete: true}, res)
			require.Equal(t, 0, a.count(t, "SELECT COUNT(*) FROM txlimit"))
			require.Equal(t, 5.0, a.remaining(t, l, "workspaceMessages", "acme"))
			// The application's rows are its own.
			require.Equal(t, 4+1+5+3+1, a.count(t, "SELECT COUNT(*) FROM messages"))
			require.Equal(t, 5, a.count(t, "SELECT COUNT(*) FROM jobs"))
		}},
	}
	for _, s := range steps {
		finished := false
		t.Run(s.name, func(t *testing.T) {
			s.run(t)
			finished = true
		})
		if !finished { // a fatal failure: the next steps would build on it
			return
		}
	}
}

// sendMessage is the README's send: the limit and the message row in one
// transaction of the application's own. A denial rolls back and returns the
// Result with its *txlimit.RateLimitedError.
func (a *appDB[TTx]) sendMessage(ctx context.Context, l *txlimit.Limiter[TTx], user, workspace, body string) (res txlimit.Result, err error) {
	err = a.inTx(ctx, func(tx TTx) error {
		res, err = l.LimitTx(ctx, tx, "sendMessage", user)
		if err != nil {
			return err
		}
		if !res.OK {
			return res.Err()
		}
		_, err = a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", user, workspace, body)
		return err
	})
	return res, err
}

// messageLimits are the limits of a message to a workspace: the sender's
// and the workspace's.
func messageLimits(user, workspace string) []txlimit.Request {
	return []txlimit.Request{{Name: "sendMessage", Key: user}, {Name: "workspaceMessages", Key: workspace}}
}

// sendWorkspaceMessage is sendMessage under both of messageLimits, all or
// none.
func (a *appDB[TTx]) sendWorkspaceMessage(ctx context.Context, l *txlimit.Limiter[TTx], user, workspace string) (all txlimit.MultiResult, err error) {
	err = a.inTx(ctx, func(tx TTx) error {
		all, err = l.LimitAllTx(ctx, tx, messageLimits(user, workspace)...)
		if err != nil {
			return err
		}
		if !all.OK {
			return all.Err()
		}
		_, err = a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", user, workspace, "to all")
		return err
	})
	return all, err
}

// sendAtCommit is sendMessage deciding at commit: the message row and the
// token commit together, or neither.
func (a *appDB[TTx]) sendAtCommit(ctx context.Context, l *txlimit.Limiter[TTx], user string) (txlimit.MultiResult, error) {
	return l.Commit(ctx, func(tx TTx) error {
		_, err := a.exec(ctx, tx, "INSERT INTO messages (user_id, workspace, body) VALUES (?, ?, ?)", user, "home", "at commit")
		return err
	}, txlimit.Request{Name: "sendMessage", Key: user})
}

// requestExport reserves an export's token and schedules the export as a
// job that runs when the token exists (res.At + res.RetryAfter), in the
// same transaction: the job exists if and only if its tokens were taken.
func (a *appDB[TTx]) requestExport(ctx context.Context, l *txlimit.Limiter[TTx], jobID, user string) (res txlimit.Result, err error) {
	err = a.inTx(ctx, func(tx TTx) error {
		res, err = l.LimitTx(ctx, tx, "export", user, txlimit.Reserve())
		if err != nil {
			return err
		}
		if !res.OK {
			return res.Err()
		}
		_, err = a.exec(ctx, tx, "INSERT INTO jobs (id, user_id, tokens, run_at, state) VALUES (?, ?, ?, ?, 'scheduled')",
			jobID, user, res.Count, res.At.Add(res.RetryAfter).UnixMicro())
		return err
	})
	return res, err
}

// cancelExport cancels a scheduled export and credits its tokens back in
// the same transaction, only when this call is the one that cancelled it:
// a credit is not tied to a reservation, so the job's row makes it happen
// once. It reports whether it cancelled the job.
func (a *appDB[TTx]) cancelExport(t *testing.T, l *txlimit.Limiter[TTx], jobID string) bool {
	t.Helper()
	ctx := context.Background()
	var user string
	var tokens float64
	require.NoError(t, a.db.QueryRowContext(ctx, a.rebind("SELECT user_id, tokens FROM jobs WHERE id = ?"), jobID).Scan(&user, &tokens))
	var cancelled bool
	require.NoError(t, a.inTx(ctx, func(tx TTx) error {
		n, err := a.exec(ctx, tx, "UPDATE jobs SET state = 'cancelled' WHERE id = ? AND state = 'scheduled'", jobID)
		if err != nil || n == 0 {
			return err
		}
		cancelled = true
		return l.CreditTx(ctx, tx, "export", user, tokens)
	}))
	return cancelled
}

// runDueJobs is one tick of the application's scheduler at now: it runs
// each job due by then, claiming it in the transaction that does its work,
// and returns their ids. The reserved tokens are the job's: it does not ask
// the limiter again.
func (a *appDB[TTx]) runDueJobs(t *testing.T, now time.Time) []string {
	t.Helper()
	ctx := context.Background()
	rows, err := a.db.QueryContext(ctx, a.rebind("SELECT id FROM jobs WHERE state = 'scheduled' AND run_at <= ? ORDER BY run_at, id"), now.UnixMicro())
	require.NoError(t, err)
	var due []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		due = append(due, id)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	var ran []string
	for _, id := range due {
		require.NoError(t, a.inTx(ctx, func(tx TTx) error {
			n, err := a.exec(ctx, tx, "UPDATE jobs SET state = 'done', ran_at = ? WHERE id = ? AND state = 'scheduled'", now.UnixMicro(), id)
			if err != nil || n == 0 {
				return err
			}
			ran = append(ran, id)
			_, err = a.exec(ctx, tx, "INSERT INTO exports (job_id, done_at) VALUES (?, ?)", id, now.UnixMicro())
			return err
		}))
	}
	return ran
}

// remainings lists the Remaining of each Result of all.
func remainings(all txlimit.MultiResult) []float64 {
	out := make([]float64, len(all.Results))
	for i, r := range all.Results {
		out[i] = r.Remaining
	}
	return out
}
