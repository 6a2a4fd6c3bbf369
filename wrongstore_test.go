package txlimit_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
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
// transaction of another driver does not compile: the compiler names both
// types. Checked by compiling such programs against this checkout.
func TestWrongTransactionTypeDoesNotCompile(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("compiles programs")
	}
	for _, tc := range []struct {
		name, store, tx, imports, want string
	}{
		{"pgstore with *sql.Tx", "pgstore.New(nil)", "*sql.Tx", `"database/sql"; "github.com/txlimit/txlimit/pgstore"`,
			"cannot use tx (variable of type *sql.Tx) as pgx.Tx value in argument to l.LimitTx"},
		{"pgsqlstore with pgx.Tx", "pgsqlstore.New(nil)", "pgx.Tx", `"github.com/jackc/pgx/v5"; "github.com/txlimit/txlimit/pgsqlstore"`,
			"cannot use tx (variable of interface type pgx.Tx) as *sql.Tx value in argument to l.LimitTx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "package main\n\nimport (\"context\"; " + tc.imports + "; \"github.com/txlimit/txlimit\")\n\n" +
				"func main() {\n\tl, _ := txlimit.New(" + tc.store + ", nil, nil)\n\tvar tx " + tc.tx +
				"\n\t_, _ = l.LimitTx(context.Background(), tx, \"n\", \"k\")\n}\n"
			file := filepath.Join(t.TempDir(), "main.go")
			require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
			out, err := exec.Command("go", "build", "-o", os.DevNull, file).CombinedOutput()
			require.Error(t, err, "%s", out)
			require.Contains(t, string(out), tc.want)
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
