package txlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/pgstore"
)

// BenchmarkPgsqlstoreSerial times pgsqlstore against pgstore, one call after
// another on one connection each, a whole transaction per call (BEGIN;
// LimitTx; COMMIT), on an unsharded limit and on 16 shards. Each iteration
// runs every subject once, in turn, so that a shared machine's load falls on
// all alike; it reports each subject's median (µs), the round trips of one
// call as the server answered them (BEGIN and COMMIT included), and the
// ratios of pgstore's median over pgsqlstore's (1 = as fast).
//
//	go test -run '^$' -bench PgsqlstoreSerial -benchtime 3000x .
func BenchmarkPgsqlstoreSerial(b *testing.B) {
	ctx := context.Background()
	schema := testdb.Schema(b)
	cfgs := map[string]txlimit.Config{"unsharded": benchConfig(1), "shards16": benchConfig(16)}

	// counted is a connection config whose round trips the counter sees,
	// without waiting for its commits to reach the disk.
	counted := func(counter *tripCounter) *pgx.ConnConfig {
		cfg := countedConfig(b, schema, counter)
		cfg.RuntimeParams["synchronous_commit"] = "off"
		return cfg
	}

	pgxTrips := &tripCounter{}
	conn, err := pgx.ConnectConfig(ctx, counted(pgxTrips))
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	lx, err := txlimit.New(pgstore.New(nil), cfgs, nil)
	require.NoError(b, err)

	sqlTrips := &tripCounter{}
	db := stdlib.OpenDB(*counted(sqlTrips))
	db.SetMaxOpenConns(1)
	b.Cleanup(func() { _ = db.Close() })
	ls, err := txlimit.New(pgsqlstore.New(db), cfgs, nil)
	require.NoError(b, err)

	key := fmt.Sprintf("%s#%d", b.Name(), benchRun.Add(1))
	viaPgx := func(name string) func() (bool, error) {
		return func() (bool, error) {
			var res txlimit.Result
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
				res, err = lx.LimitTx(ctx, tx, name, key)
				return err
			})
			return res.OK, err
		}
	}
	viaSQL := func(name string) func() (bool, error) {
		return func() (bool, error) {
			var res txlimit.Result
			err := pgsqlstore.RunTx(ctx, db, nil, func(tx *sql.Tx) (err error) {
				res, err = ls.LimitTx(ctx, tx, name, key)
				return err
			})
			return res.OK, err
		}
	}
	subjects := []serialSubject{
		{"pgstore", viaPgx("unsharded"), pgxTrips},
		{"pgsqlstore", viaSQL("unsharded"), sqlTrips},
		{"pgstore-shards16", viaPgx("shards16"), pgxTrips},
		{"pgsqlstore-shards16", viaSQL("shards16"), sqlTrips},
	}
	// Warm up: rows created, statements prepared.
	for range 3 {
		for _, s := range subjects {
			ok, err := s.op()
			require.NoError(b, err)
			require.True(b, ok)
		}
	}
	p50 := runSerial(b, subjects)
	b.ReportMetric(p50["pgstore"]/p50["pgsqlstore"], "sql/pgx")
	b.ReportMetric(p50["pgstore-shards16"]/p50["pgsqlstore-shards16"], "sql/pgx-shards16")
}
