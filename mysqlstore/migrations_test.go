package mysqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

// migrations.Up on MySQL: its own version table beside the application's
// goose history, idempotent, undone by Down, and the files usable as plain
// goose migrations; several instances starting at once apply them once
// (goose's lock row in migrations.LockTable).
func TestMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Open(t, mysqltest.EmptyDatabase(t), 12)
	_, err := db.Exec("CREATE TABLE goose_db_version (id INT, version_id BIGINT, is_applied BOOL)")
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = migrations.Up(ctx, db, migrations.MySQL) }()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL), "Up is idempotent")
	_, err = db.Exec("INSERT INTO txlimit (name, `key`, shard, value, ts) VALUES ('n', 'k', 0, 1, UTC_TIMESTAMP(6))")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO txlimit (name, `key`, shard, value, ts) VALUES ('n', 'k', -1, 1, UTC_TIMESTAMP(6))")
	require.Error(t, err, "a negative shard is refused")
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM goose_db_version").Scan(&n))
	require.Zero(t, n, "the application's goose table is untouched")
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+migrations.VersionTable+" WHERE version_id = 1").Scan(&n))
	require.Equal(t, 1, n, "applied once")

	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, v) // 2: txlimit_holder, 3: paused_until, 4: txlimit_idempotency
	_, err = p.DownTo(ctx, 0)
	require.NoError(t, err)
	_, err = db.Exec("SELECT 1 FROM txlimit")
	require.Error(t, err, "down drops the table")

	fsys, err := migrations.FS(migrations.MySQL)
	require.NoError(t, err)
	_, err = db.Exec("DROP TABLE goose_db_version")
	require.NoError(t, err)
	plain, err := goose.NewProvider(goose.DialectMySQL, db, fsys)
	require.NoError(t, err)
	_, err = plain.Up(ctx)
	require.NoError(t, err)
	_, err = db.Exec("SELECT 1 FROM txlimit")
	require.NoError(t, err, "the files are plain goose migrations too")
}

// The migration that adds paused_until runs on a table the version before
// it wrote: no key is paused, the row decides as before, a pause then works,
// and rolling it back keeps the rows.
func TestUpgradeAddsPausedUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.Open(t, mysqltest.EmptyDatabase(t), 4)
	p, err := migrations.Provider(db, migrations.MySQL)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 2)
	require.NoError(t, err)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	_, err = db.Exec("INSERT INTO txlimit (name, `key`, shard, value, ts) VALUES ('bucket', 'k', 0, 3.5, ?)", at.Add(-3*time.Second))
	require.NoError(t, err)
	l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{"bucket": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 20}},
		&txlimit.Options{Clock: func() time.Time { return at }})
	require.NoError(t, err)
	require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated, "the version before lacks paused_until")

	require.NoError(t, migrations.Up(ctx, db, migrations.MySQL))
	require.NoError(t, l.Ping(ctx))
	var paused int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM txlimit WHERE paused_until IS NOT NULL").Scan(&paused))
	require.Zero(t, paused)
	res, err := l.Limit(ctx, "bucket", "k", txlimit.Count(4)) // 3.5 + 3 seconds of 10 a minute
	require.NoError(t, err)
	require.True(t, res.OK, "%+v", res)
	require.Zero(t, res.Remaining)
	require.NoError(t, l.Pause(ctx, "bucket", "k", at.Add(time.Minute)))
	res, err = l.Check(ctx, "bucket", "k", txlimit.Count(0))
	require.NoError(t, err)
	require.True(t, res.Paused)
	require.Equal(t, time.Minute, res.RetryAfter)

	_, err = p.DownTo(ctx, 2)
	require.NoError(t, err)
	var rows int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM txlimit WHERE name = 'bucket'").Scan(&rows))
	require.Equal(t, 1, rows)
	require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated)
}
