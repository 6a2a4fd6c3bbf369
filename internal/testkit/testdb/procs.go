package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Helpers that start server processes of their own (PgBouncer, extra
// PostgreSQL clusters) for a test and stop them when it ends.

// Need returns the path of the executable name, found on PATH or in one of
// dirs. When it is missing the test skips, except under CI=true, where it
// fails: CI installs it with the script named by install.
func Need(tb testing.TB, name, install string, dirs ...string) string {
	tb.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required under CI=true: run %s (which .ci/run does) to install it", name, install)
	}
	tb.Skipf("SKIPPING: %s is not installed (run %s)", name, install)
	return ""
}

var (
	portMu   sync.Mutex
	portUsed = map[int]bool{}
)

// FreePort returns a loopback TCP port in [lo, hi] that nothing listens on
// and that no other test of this process has taken.
func FreePort(tb testing.TB, lo, hi int) int {
	tb.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for p := lo; p <= hi; p++ {
		if portUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		_ = l.Close()
		portUsed[p] = true
		return p
	}
	tb.Fatalf("no free port in %d-%d", lo, hi)
	return 0
}

// serviceUser is the unprivileged account server processes run as when the
// test runs as root: PgBouncer, PostgreSQL and pg_autoctl refuse root.
const serviceUser = "postgres"

// AsServiceUser returns a command running name with args, as the postgres
// user when the test runs as root (through runuser), as the current user
// otherwise.
func AsServiceUser(ctx context.Context, name string, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", serviceUser, "--", name}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
	}
	// Its own process group, so that stopping it stops its children too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// ServiceDir returns a new empty directory, removed when tb ends, that the
// server processes can write: owned by the postgres user when the test runs
// as root. (t.TempDir is under a directory only root can enter.)
func ServiceDir(tb testing.TB, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		tb.Fatalf("temp dir: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup(serviceUser)
		if err != nil {
			tb.Fatalf("running as root needs the %s user to run server processes: %v", serviceUser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatalf("chown %s: %v", dir, err)
		}
	}
	return dir
}

// WriteServiceFile writes a file into a ServiceDir, readable by the service
// user.
func WriteServiceFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		tb.Fatalf("write %s: %v", path, err)
	}
}

// Stop ends the process group of cmd: SIGTERM, then SIGKILL after grace.
func Stop(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Database creates a new, empty database on the test server, dropped when
// tb ends (after the cleanups registered later, such as a PgBouncer in front
// of it), and returns its name and a URL to it.
func Database(tb testing.TB, prefix string) (name, url string) {
	tb.Helper()
	base := URL(tb)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = prefix + "_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = conn.Close(context.Background())
		}
	})
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		tb.Fatalf("parse url: %v", err)
	}
	return name, withDatabase(cfg, name)
}

func withDatabase(cfg *pgx.ConnConfig, db string) string {
	u := "postgres://" + cfg.User
	if cfg.Password != "" {
		u += ":" + cfg.Password
	}
	return fmt.Sprintf("%s@%s/%s?sslmode=disable", u, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), db)
}

// NeedPgBouncer is Need for pgbouncer. Tests call it before Database:
// creating and dropping a database costs seconds (the drop waits for a
// checkpoint), spent for nothing when the test then skips.
func NeedPgBouncer(tb testing.TB) string {
	tb.Helper()
	return Need(tb, "pgbouncer", "scripts/pgbouncer.sh", "/usr/sbin")
}

// PgBouncerPorts is the range of loopback ports PgBouncer takes a free one from.
const (
	PgBouncerPortLo = 6440
	PgBouncerPortHi = 6449
)

// PgBouncer starts a PgBouncer process of its own in front of database db
// of the test server, in the given pool mode ("transaction", "session"),
// with at most poolSize server connections, and returns the URL clients
// connect to. It is stopped when tb ends. Clients through a transaction-mode
// PgBouncer need an exec mode that prepares nothing named (docs/scale-out.md
// gives each mode as measured): pgx.QueryExecModeExec, for one.
func PgBouncer(tb testing.TB, db, mode string, poolSize int) string {
	tb.Helper()
	bin := NeedPgBouncer(tb)
	cfg, err := pgx.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("parse url: %v", err)
	}
	dir := ServiceDir(tb, "txlimit-pgbouncer-")
	port := FreePort(tb, PgBouncerPortLo, PgBouncerPortHi)
	server := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", cfg.Host, cfg.Port, db, cfg.User)
	if cfg.Password != "" {
		server += " password=" + cfg.Password
	}
	ini := strings.Join([]string{
		"[databases]",
		db + " = " + server,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"pool_mode = " + mode,
		"default_pool_size = " + strconv.Itoa(poolSize),
		"max_client_conn = 200",
		"server_reset_query =",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"",
	}, "\n")
	WriteServiceFile(tb, filepath.Join(dir, "pgbouncer.ini"), ini)
	WriteServiceFile(tb, filepath.Join(dir, "userlist.txt"), fmt.Sprintf("%q \"\"\n", cfg.User))

	cmd := AsServiceUser(context.Background(), bin, filepath.Join(dir, "pgbouncer.ini"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() { Stop(cmd, done, 5*time.Second) })

	url := withDatabase(&pgx.ConnConfig{Config: cfg.Config}, db)
	url = strings.Replace(url, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 1)
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("pgbouncer exited: %s\n%s", out.String(), log)
		default:
		}
		if err := ping(url); err == nil {
			return url
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			tb.Fatalf("pgbouncer on port %d does not answer: %v\n%s\n%s", port, err, out.String(), log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
