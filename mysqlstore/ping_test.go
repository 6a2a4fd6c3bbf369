package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

// Ping names each DSN setting the store needs, told apart by what the driver
// does; the setting fixed, Ping passes.
func TestPingNamesTheDSNSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := mysqltest.EmptyDatabase(t)
	require.NoError(t, migrations.Up(ctx, mysqltest.Open(t, cfg, 2), migrations.MySQL))
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	for _, tc := range []struct {
		desc, param string
		change      func(c *mysql.Config)
	}{
		{"without parseTime", "parseTime=true", func(c *mysql.Config) { c.ParseTime = false }},
		{"with loc in another zone", "loc", func(c *mysql.Config) { c.Loc = berlin }},
		{"with clientFoundRows", "clientFoundRows", func(c *mysql.Config) { c.ClientFoundRows = true }},
		{"without interpolateParams", "interpolateParams=true", func(c *mysql.Config) { c.InterpolateParams = false }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := cfg.Clone()
			tc.change(c)
			db := mysqltest.Open(t, c, 2)
			l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{"n": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}, nil)
			require.NoError(t, err)
			err = l.Ping(ctx)
			require.ErrorIs(t, err, mysqlstore.ErrDSN)
			require.ErrorContains(t, err, tc.param)
			require.False(t, mysqlstore.Retryable(err), "no retry cures a DSN")
		})
	}
	t.Run("with every setting", func(t *testing.T) {
		db := mysqltest.Open(t, cfg, 2)
		ping := func(db *sql.DB) error { return driver.OpsOf[*sql.Tx](mysqlstore.New(db)).Ping(ctx) }
		require.NoError(t, ping(db))
		// multiStatements is not used: either value works.
		c := cfg.Clone()
		c.MultiStatements = true
		require.NoError(t, ping(mysqltest.Open(t, c, 2)))
	})
}

// A call on a DSN without parseTime or with another loc fails with the
// same error as Ping, naming the parameter, and its transaction writes
// nothing that commits.
func TestCallsNameTheDSNSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := mysqltest.EmptyDatabase(t)
	good := mysqltest.Open(t, cfg, 2)
	require.NoError(t, migrations.Up(ctx, good, migrations.MySQL))
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	for _, tc := range []struct {
		desc, param string
		change      func(c *mysql.Config)
	}{
		{"without parseTime", "parseTime=true", func(c *mysql.Config) { c.ParseTime = false }},
		{"with loc in another zone", "loc", func(c *mysql.Config) { c.Loc = berlin }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := cfg.Clone()
			tc.change(c)
			db := mysqltest.Open(t, c, 2)
			for _, shards := range []int{1, 3} {
				l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
					"n": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour, Shards: shards},
				}, &txlimit.Options{Clock: func() time.Time { return at }})
				require.NoError(t, err)
				_, err = l.Limit(ctx, "n", tc.desc)
				require.ErrorIs(t, err, mysqlstore.ErrDSN)
				require.ErrorContains(t, err, tc.param)
				// On the server's clock even a read of a key with no row
				// reads a DATETIME.
				onServerClock, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
					"n": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour, Shards: shards},
				}, nil)
				require.NoError(t, err)
				_, err = onServerClock.Check(ctx, "n", tc.desc, txlimit.Count(0))
				require.ErrorIs(t, err, mysqlstore.ErrDSN)
				require.ErrorContains(t, err, tc.param)
				require.Empty(t, mysqltest.Rows(t, good, "n", tc.desc), "nothing committed")
			}
		})
	}
}

// A database without the table answers every call, and Ping, with
// txlimit.ErrNotMigrated, whose message names migrations.Up; FailOpen does
// not turn that into a grant.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Open(t, mysqltest.EmptyDatabase(t), 2)
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}},
		&txlimit.Options{FailOpen: true})
	require.NoError(t, err)
	for _, err := range []error{
		l.Ping(ctx),
		func() error { _, err := l.Limit(ctx, "l", "k"); return err }(),
		func() error { _, err := l.Check(ctx, "l", "k"); return err }(),
	} {
		require.ErrorIs(t, err, txlimit.ErrNotMigrated)
		require.Contains(t, err.Error(), "migrations.Up")
		var myErr *mysql.MySQLError
		require.ErrorAs(t, err, &myErr, "the driver's error stays reachable")
		require.EqualValues(t, 1146, myErr.Number)
	}
}

// mysqlstore on PostgreSQL says so, at Ping and at the first call, and names
// the store to use.
func TestWrongDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}, nil)
	require.NoError(t, err)
	err = l.Ping(ctx)
	require.ErrorIs(t, err, mysqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "pgsqlstore")
	_, err = l.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, mysqlstore.ErrWrongDatabase)
	require.ErrorContains(t, err, "pgsqlstore")
}

// Without a database only the …Tx forms work.
func TestNoDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := txlimit.New(mysqlstore.New(nil), map[string]txlimit.Config{"l": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}, nil)
	require.NoError(t, err)
	_, err = l.Limit(ctx, "l", "k")
	storetest.RequireNoPool(t, err)
	storetest.RequireNoPool(t, l.Ping(ctx))
	db := mysqltest.Database(t, 2)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	res, err := l.LimitTx(ctx, tx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
}

// A DSN the store cannot work with is the deployment's mistake, not an
// outage: under FailOpen the calls still fail, naming the parameter, and
// Ping's DSN errors are setup errors too. The control: a failure of the
// database itself (a closed pool) is granted under the same options.
func TestFailOpenRefusesDSN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := mysqltest.EmptyDatabase(t)
	require.NoError(t, migrations.Up(ctx, mysqltest.Open(t, cfg, 2), migrations.MySQL))
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	limiter := func(db *sql.DB, shards int) *txlimit.Limiter[*sql.Tx] {
		l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
			"n": {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour, Shards: shards},
		}, &txlimit.Options{FailOpen: true})
		require.NoError(t, err)
		return l
	}
	for _, tc := range []struct {
		desc, param string
		change      func(c *mysql.Config)
		calls       bool // the calls fail too, not only Ping
	}{
		{"without parseTime", "parseTime=true", func(c *mysql.Config) { c.ParseTime = false }, true},
		{"with loc in another zone", "loc", func(c *mysql.Config) { c.Loc = berlin }, true},
		{"with clientFoundRows", "clientFoundRows", func(c *mysql.Config) { c.ClientFoundRows = true }, false},
		{"without interpolateParams", "interpolateParams=true", func(c *mysql.Config) { c.InterpolateParams = false }, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := cfg.Clone()
			tc.change(c)
			db := mysqltest.Open(t, c, 2)
			err := limiter(db, 1).Ping(ctx)
			require.ErrorIs(t, err, mysqlstore.ErrDSN)
			require.ErrorIs(t, err, driver.ErrSetup)
			if !tc.calls {
				return
			}
			for _, shards := range []int{1, 3} {
				l := limiter(db, shards)
				res, err := l.Limit(ctx, "n", tc.desc)
				require.ErrorIs(t, err, mysqlstore.ErrDSN)
				require.ErrorIs(t, err, driver.ErrSetup)
				require.ErrorContains(t, err, tc.param)
				require.False(t, res.OK || res.FailedOpen, "FailOpen granted a call on a DSN the store cannot use: %+v", res)
				multi, err := l.LimitAll(ctx, req("n", tc.desc))
				require.ErrorIs(t, err, mysqlstore.ErrDSN)
				require.False(t, multi.OK, "FailOpen granted a LimitAll on a DSN the store cannot use")
			}
		})
	}
	t.Run("control: a closed pool fails open", func(t *testing.T) {
		db := mysqltest.Open(t, cfg, 2)
		require.NoError(t, db.Close())
		res, err := limiter(db, 1).Limit(ctx, "n", "closed")
		require.NoError(t, err)
		require.True(t, res.OK && res.FailedOpen, "%+v", res)
	})
}
