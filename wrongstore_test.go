package txlimit_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// A store fixes the limiter's transaction type, so handing LimitTx a
// transaction of another driver does not compile. Checked by compiling two
// programs against this checkout that differ only in the transaction's
// type: the store's compiles, the other does not, at the LimitTx line.
// (The compiler's wording is the compiler's, and not asserted.)
func TestWrongTransactionTypeDoesNotCompile(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("SKIPPING under -short: compiles four programs with the go command (a few seconds); run without -short")
	}
	const imports = `"database/sql"; "github.com/jackc/pgx/v5"; "github.com/txlimit/txlimit/pgsqlstore"; "github.com/txlimit/txlimit/pgstore"`
	// build returns the compiler's output, the position of the LimitTx
	// call as it names positions, and its error.
	build := func(t *testing.T, store, tx string) (string, string, error) {
		src := "package main\n\nimport (\"context\"; " + imports + "; \"github.com/txlimit/txlimit\")\n\n" +
			"var _ = sql.Open\nvar _ pgx.Tx\nvar _ = pgstore.New\nvar _ = pgsqlstore.New\n\n" +
			"func main() {\n\tl, _ := txlimit.New(" + store + ", nil, nil)\n\tvar tx " + tx +
			"\n\t_, _ = l.LimitTx(context.Background(), tx, \"n\", \"k\")\n}\n"
		line := strings.Count(src[:strings.Index(src, "l.LimitTx")], "\n") + 1
		file := filepath.Join(t.TempDir(), "main.go")
		require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
		out, err := exec.Command("go", "build", "-o", os.DevNull, file).CombinedOutput()
		return string(out), fmt.Sprintf("main.go:%d:", line), err
	}
	for _, tc := range []struct{ name, store, right, wrong string }{
		{"pgstore", "pgstore.New(nil)", "pgx.Tx", "*sql.Tx"},
		{"pgsqlstore", "pgsqlstore.New(nil)", "*sql.Tx", "pgx.Tx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := build(t, tc.store, tc.right)
			require.NoError(t, err, "with the store's own transaction type: %s", out)
			out, at, err := build(t, tc.store, tc.wrong)
			require.Error(t, err, "with %s", tc.wrong)
			require.Contains(t, out, at, "the error is at the LimitTx call")
		})
	}
}

// A store given a database of another kind says so, naming the store to
// use, at Ping and at the first call in a transaction.
func TestWrongDatabaseIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limits := map[string]txlimit.Config{"n": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Second}}

	t.Run("pgsqlstore on SQLite", func(t *testing.T) {
		db := testdb.OpenSQLite(t)
		l, err := txlimit.New(pgsqlstore.New(db), limits, nil)
		require.NoError(t, err)
		err = l.Ping(ctx)
		require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
		require.ErrorContains(t, err, "use sqlitestore.New(db)")

		// No retry cures it: a limiter that fails open returns it too.
		open, err := txlimit.New(pgsqlstore.New(db), limits, &txlimit.Options{FailOpen: true})
		require.NoError(t, err)
		res, err := open.Limit(ctx, "n", "k")
		require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
		require.False(t, res.FailedOpen)

		tx, err := db.Begin()
		require.NoError(t, err)
		defer tx.Rollback()
		_, err = l.LimitTx(ctx, tx, "n", "k")
		require.ErrorIs(t, err, pgsqlstore.ErrWrongDatabase)
		require.ErrorContains(t, err, "it is SQLite")
	})

	t.Run("sqlitestore on PostgreSQL", func(t *testing.T) {
		db := stdlib.OpenDBFromPool(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeExec, 2))
		defer db.Close()
		l, err := txlimit.New(sqlitestore.New(db), limits, nil)
		require.NoError(t, err)
		err = l.Ping(ctx)
		require.ErrorIs(t, err, sqlitestore.ErrWrongDatabase)
		require.ErrorContains(t, err, "use pgsqlstore.New(db)")

		for _, call := range []func(tx *sql.Tx) error{
			func(tx *sql.Tx) error { _, err := l.LimitTx(ctx, tx, "n", "k"); return err },
			func(tx *sql.Tx) error { _, err := l.CheckTx(ctx, tx, "n", "k", txlimit.Count(0)); return err },
		} {
			tx, err := db.Begin()
			require.NoError(t, err)
			err = call(tx)
			_ = tx.Rollback()
			require.ErrorIs(t, err, sqlitestore.ErrWrongDatabase)
			require.ErrorContains(t, err, "use pgsqlstore.New(db)")
		}
	})
}
