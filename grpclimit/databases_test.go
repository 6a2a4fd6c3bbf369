package grpclimit_test

import (
	"context"
	"database/sql"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
	_ "modernc.org/sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// The databases the tests run on: a SQLite file in the test's temp dir, and
// PostgreSQL as internal/testkit/testdb finds it (TEST_DATABASE_URL, the local
// server, a container), in a schema of the test's own. Without PostgreSQL
// the PostgreSQL tests skip, loudly, except under CI=true, where they fail.

// dbState is the state of the database a limiter is opened on.
type dbState int

const (
	migrated   dbState = iota // txlimit's table is there
	unmigrated                // the table is missing: every call is ErrNotMigrated
	closed                    // the database is closed: every call is a store error
)

// opener opens a limiter with limits and opts on a new database in state.
type opener[TTx any] func(t *testing.T, state dbState, limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[TTx]

func sqliteLimiter(t *testing.T, state dbState, limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[*sql.Tx] {
	t.Helper()
	l, _ := sqliteLimiterDB(t, state, limits, opts)
	return l
}

// sqliteLimiterDB is sqliteLimiter that also returns the database.
func sqliteLimiterDB(t *testing.T, state dbState, limits map[string]txlimit.Config, opts *txlimit.Options) (*txlimit.Limiter[*sql.Tx], *sql.DB) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+testdb.SQLitePath(t)+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	if state != unmigrated {
		require.NoError(t, migrations.Up(context.Background(), db, migrations.SQLite))
	}
	if state == closed {
		require.NoError(t, db.Close())
	}
	l, err := txlimit.New(sqlitestore.New(db), limits, opts)
	require.NoError(t, err)
	return l, db
}

func postgresLimiter(t *testing.T, state dbState, limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[pgx.Tx] {
	t.Helper()
	var schema string
	if state == unmigrated {
		schema = testdb.EmptySchema(t) // without the table: every call is ErrNotMigrated
	} else {
		schema = testdb.Schema(t)
	}
	pool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8)
	if state == closed {
		pool.Close()
	}
	l, err := txlimit.New(pgstore.New(pool), limits, opts)
	require.NoError(t, err)
	return l
}

// frozen is a clock that stands still, so that no token refills during a
// test and every count is exact.
func frozen() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }

// serve starts a gRPC server with the health service and opts on an
// in-memory listener, and returns a client connected to it. Both stop when
// the test ends.
func serve(t *testing.T, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	return serveHealth(t, health.NewServer(), opts...)
}

// serveHealth is serve with the health service hs.
func serveHealth(t *testing.T, hs healthpb.HealthServer, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}
