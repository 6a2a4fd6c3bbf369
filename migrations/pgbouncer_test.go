package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

// TestUpConcurrentThroughPgBouncer runs 16 concurrent Up calls, as 16
// application instances starting at once, through a real PgBouncer in
// transaction mode with fewer server connections than clients, so that the
// statements of one client run on server connections another client used
// a moment before. A session advisory lock leaks or hangs there; the table
// lock must not: every call returns nil within its deadline, each migration
// is recorded exactly once, and no lock is left behind.
func TestUpConcurrentThroughPgBouncer(t *testing.T) {
	testdb.NeedPgBouncer(t)
	db, direct := testdb.Database(t, "txlimit_pgbouncer")
	url := testdb.PgBouncer(t, db, "transaction", 4)

	const clients = 16
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbs := make([]*sql.DB, clients)
	for i := range dbs {
		cfg, err := pgx.ParseConfig(url)
		require.NoError(t, err)
		// The exec modes that work through a transaction-mode pooler: no
		// named prepared statement outlives a transaction.
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		if i%2 == 1 {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}
		dbs[i] = stdlib.OpenDB(*cfg)
		dbs[i].SetMaxOpenConns(2)
		t.Cleanup(func() { _ = dbs[i].Close() })
	}

	errs := make([]error, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = migrations.Up(ctx, dbs[i], migrations.Postgres)
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("16 concurrent Up calls through PgBouncer (transaction mode, 4 server connections) took %v", time.Since(began).Round(time.Millisecond))
	for i, err := range errs {
		require.NoError(t, err, "client %d", i)
	}

	// Check directly on the server, not through the pooler.
	conn, err := pgx.Connect(context.Background(), direct)
	require.NoError(t, err)
	defer conn.Close(context.Background())

	fsys, err := migrations.FS(migrations.Postgres)
	require.NoError(t, err)
	files, err := fs.Glob(fsys, "*.sql")
	require.NoError(t, err)
	var applied, distinct, latest int64
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT version_id), coalesce(max(version_id), 0)
		   FROM `+migrations.VersionTable+` WHERE version_id > 0 AND is_applied`).Scan(&applied, &distinct, &latest))
	require.EqualValues(t, len(files), applied, "each migration recorded exactly once")
	require.EqualValues(t, len(files), distinct)
	p, err := migrations.Provider(dbs[0], migrations.Postgres)
	require.NoError(t, err)
	v, err := p.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, latest, v, "the schema is at the latest version")
	_, err = conn.Exec(context.Background(), "SELECT 1 FROM txlimit")
	require.NoError(t, err)

	var locked int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM `+migrations.LockTable+` WHERE locked`).Scan(&locked))
	require.Zero(t, locked, "the lock row is released")
	var advisory int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		  WHERE l.locktype = 'advisory' AND d.datname = $1`, db).Scan(&advisory))
	require.Zero(t, advisory, "no advisory lock held")

	// And Up again through the pooler is a no-op that returns at once.
	require.NoError(t, migrations.Up(ctx, dbs[1], migrations.Postgres))
}
