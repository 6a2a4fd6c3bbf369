package txlimit_test

// The stores' SingleKeyStatements option (Citus with txlimit distributed by
// key) must keep every statement that locks or writes rows to one key. A
// pgx tracer records every statement the stores send, alone or in a batch,
// with its arguments, and the test fails on any that takes an array of names
// or keys. The same workload without the option must trip the check on each
// of the four multi-key statements, so the check is known to see them.

import (
	"context"
	"database/sql"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/pgstore"
)

// statementLog is a pgx.QueryTracer and pgx.BatchTracer that records the
// name (sqlc's "-- name:" line) of every statement sent, and why it touches
// several keys, if it does.
type statementLog struct {
	mu       sync.Mutex
	names    map[string]bool
	multiKey map[string]string // statement name -> why
}

func newStatementLog() *statementLog {
	return &statementLog{names: map[string]bool{}, multiKey: map[string]string{}}
}

var sqlcName = regexp.MustCompile(`^-- name: (\w+)`)

func (l *statementLog) add(sql string, args []any) {
	name := strings.SplitN(sql, "\n", 2)[0]
	if m := sqlcName.FindStringSubmatch(sql); m != nil {
		name = m[1]
	}
	why := ""
	// Both stores send names and keys as text[]: pgx as a []string,
	// pgsqlstore as an array literal cast on the server (::text::text[]).
	if strings.Contains(sql, "text[]") {
		why = "an array of text (names or keys) in the SQL"
	}
	for _, a := range args {
		if _, ok := a.([]string); ok {
			why = "a []string argument"
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names[name] = true
	if why != "" {
		l.multiKey[name] = why
	}
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL, d.Args)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL, d.Args)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracedConfig is a pgx connection config on a fresh migrated schema whose
// statements go to log.
func tracedConfig(t *testing.T, log *statementLog) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = testdb.Schema(t)
	cfg.Tracer = log
	return cfg
}

// singleKeyWorkload goes through every path of LimitAll and Prune that
// touches rows of several keys: LimitAll creating and locking rows of three
// limits (one of them sharded), LimitAll denied by one limit (the rows it
// created for another are deleted again), and Prune deleting full rows.
func singleKeyWorkload[TTx any](t *testing.T, store driver.Store[TTx]) {
	ctx := context.Background()
	clock := storetest.NewClock()
	a, b, c := storetest.UniqueName(t, "a"), storetest.UniqueName(t, "b"), storetest.UniqueName(t, "c")
	l, err := txlimit.New(store, map[string]txlimit.Config{
		a: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour},
		b: {Kind: txlimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: 4},
		c: {Kind: txlimit.FixedWindow, Rate: 2, Period: time.Hour},
	}, &txlimit.Options{Clock: clock.Now})
	require.NoError(t, err)

	res, err := l.LimitAll(ctx, txlimit.Request{Name: a, Key: "k1"}, txlimit.Request{Name: b, Key: "k1"}, txlimit.Request{Name: c, Key: "k1"})
	require.NoError(t, err)
	require.True(t, res.OK)
	for range 2 {
		r, err := l.Limit(ctx, c, "k2")
		require.NoError(t, err)
		require.True(t, r.OK)
	}
	res, err = l.LimitAll(ctx, txlimit.Request{Name: a, Key: "k3"}, txlimit.Request{Name: b, Key: "k3"}, txlimit.Request{Name: c, Key: "k2"})
	require.NoError(t, err)
	require.False(t, res.OK, "c/k2 is empty")
	v, err := l.Check(ctx, a, "k3", txlimit.Count(0))
	require.NoError(t, err)
	require.Equal(t, 2.0, v.Remaining, "a/k3 took nothing")

	clock.Advance(2 * time.Hour)
	pruned, err := l.Prune(ctx, nil)
	require.NoError(t, err)
	// a/k1, b/k1 (4 shards), c/k1 and c/k2 have refilled: 7 rows.
	require.Equal(t, 7, pruned.Deleted)
}

// TestSingleKeyStatements runs the workload on pgstore and pgsqlstore (pgx's
// database/sql driver, traced the same way), with and without the option.
func TestSingleKeyStatements(t *testing.T) {
	t.Parallel()
	multiKeyStatements := []string{"InsertKeys", "LockKeys", "LockIdle", "DeleteShards"}
	singleKeyStatements := []string{"InsertKeyShards", "LockShards", "LockIdleKey", "DeleteKeyShards"}
	stores := []struct {
		name string
		run  func(t *testing.T, log *statementLog, singleKey bool)
	}{
		{"pgstore", func(t *testing.T, log *statementLog, singleKey bool) {
			var opts []pgstore.Option
			if singleKey {
				opts = append(opts, pgstore.SingleKeyStatements())
			}
			cfg, err := pgxpool.ParseConfig("")
			require.NoError(t, err)
			cfg.ConnConfig = tracedConfig(t, log)
			cfg.MaxConns = 2
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(p.Close)
			singleKeyWorkload(t, pgstore.New(p, opts...))
		}},
		{"pgsqlstore", func(t *testing.T, log *statementLog, singleKey bool) {
			db := stdlib.OpenDB(*tracedConfig(t, log))
			db.SetMaxOpenConns(2)
			t.Cleanup(func() { _ = db.Close() })
			var opts []pgsqlstore.Option
			if singleKey {
				opts = append(opts, pgsqlstore.SingleKeyStatements())
			}
			singleKeyWorkload[*sql.Tx](t, pgsqlstore.New(db, opts...))
		}},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Run("default", func(t *testing.T) {
				log := newStatementLog()
				s.run(t, log, false)
				for _, name := range multiKeyStatements {
					require.Contains(t, log.multiKey, name, "the check must see %s, a statement over several keys", name)
				}
			})
			t.Run("single_key_statements", func(t *testing.T) {
				log := newStatementLog()
				s.run(t, log, true)
				require.Empty(t, log.multiKey, "statements that touch several keys")
				for _, name := range singleKeyStatements {
					require.True(t, log.names[name], "%s ran", name)
				}
				for _, name := range multiKeyStatements {
					require.False(t, log.names[name], "%s ran", name)
				}
				require.True(t, log.names["ScanKeys"], "Prune scanned for keys (the one statement that reads several keys, locking nothing)")
			})
		})
	}
}
