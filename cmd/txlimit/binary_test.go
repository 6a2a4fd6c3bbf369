package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

// TestBinary builds the command and checks that main exits with what run
// returns.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "txlimit")
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds the binary")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	dsn := testdb.SQLitePath(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-help"}, exitOK, "Exit status: 0 done"},
		{[]string{"migrate", "up", "-dsn", dsn}, exitOK, "applied 00001_create_txlimit.sql"},
		{[]string{"keys", "-dsn", dsn}, exitOK, "0 key(s) with state"},
		{[]string{"migrate", "status", "-dsn", dsn + ".typo"}, exitError, "no SQLite database at"},
		{[]string{"migrate", "status", "-dsn", "root:@tcp(127.0.0.1:1)/x"}, exitError, "connect to MySQL or MariaDB (the -dsn selected mysqlstore)"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = []string{} // no TXLIMIT_DSN from the environment
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, c.code, code, "txlimit %s: %s", strings.Join(c.args, " "), out)
		require.Contains(t, string(out), c.want)
	}
}
