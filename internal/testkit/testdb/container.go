package testdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// dockerEngine reports whether a Docker engine answers: nil when one does.
// It asks DOCKER_HOST when set, else the usual sockets (the system one,
// rootless Docker's, Docker Desktop's), with GET /_ping. Any HTTP answer
// counts: whether the engine can run the container is for the container
// program to find out. DOCKER_HOST schemes other than unix:// and tcp://
// (ssh://, npipe://) cannot be probed here and are assumed to answer.
func dockerEngine(getenv func(string) string) error {
	if host := getenv("DOCKER_HOST"); host != "" {
		if err := pingDocker(host); err != nil {
			return fmt.Errorf("DOCKER_HOST=%s: %w", host, err)
		}
		return nil
	}
	var errs []string
	for _, sock := range dockerSockets(getenv) {
		err := pingDocker("unix://" + sock)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("DOCKER_HOST is unset and no Docker socket answers: %s", strings.Join(errs, "; "))
}

// systemDockerSocket is the system engine's socket; a test moves it.
var systemDockerSocket = "/var/run/docker.sock"

func dockerSockets(getenv func(string) string) []string {
	socks := []string{systemDockerSocket}
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		socks = append(socks, filepath.Join(d, "docker.sock"))
	}
	if h := getenv("HOME"); h != "" {
		socks = append(socks, filepath.Join(h, ".docker", "run", "docker.sock"))
	}
	return socks
}

func pingDocker(host string) error {
	u, err := url.Parse(host)
	if err != nil {
		return err
	}
	transport := &http.Transport{}
	var target string
	switch u.Scheme {
	case "unix":
		path := u.Path
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		target = "http://docker/_ping"
	case "tcp", "http", "https":
		scheme := "http"
		if u.Scheme == "https" {
			scheme = "https"
		}
		target = scheme + "://" + u.Host + "/_ping"
	default:
		return nil
	}
	client := &http.Client{Transport: transport, Timeout: 3 * time.Second}
	defer transport.CloseIdleConnections()
	resp, err := client.Get(target)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// container is the running container program, kept for the life of the test
// binary: its stdin is the pipe whose closing, when the binary exits, tells
// the program to remove the container.
var container struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited <-chan error // receives cmd.Wait's result
}

// startContainer runs internal/testkit/pgcontainer with `go run` and returns the
// URL of the PostgreSQL server it started.
func startContainer() (string, error) {
	dir, err := pgcontainerDir()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the container program is run with `go run`: %w", err)
	}
	cmd := exec.Command(goBin, "run", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	// The first run downloads testcontainers-go and pulls the image.
	return launch(cmd, 10*time.Minute)
}

// pgcontainerDir finds internal/testkit/pgcontainer next to this package's source.
func pgcontainerDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate internal/testkit/testdb's source")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "pgcontainer")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("internal/testkit/pgcontainer not found next to internal/testkit/testdb (tests built with -trimpath?): %w", err)
	}
	return dir, nil
}

// launch starts cmd, which must print a URL as its first line and live until
// its stdin closes, and returns that URL. cmd keeps running after launch
// returns; when it fails or times out it is stopped.
func launch(cmd *exec.Cmd, timeout time.Duration) (string, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", err
	}
	first := &firstLine{ch: make(chan string, 1)}
	cmd.Stdout = first
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", strings.Join(cmd.Args, " "), err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func(why error) (string, error) {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		<-exited
		return "", fmt.Errorf("%s in %s: %w: %s", strings.Join(cmd.Args, " "), cmd.Dir, why, strings.TrimSpace(stderr.String()))
	}
	select {
	case line := <-first.ch:
		u := strings.TrimSpace(line)
		if !strings.HasPrefix(u, "postgres://") {
			return stop(fmt.Errorf("first line is not a postgres:// URL: %q", u))
		}
		container.cmd, container.stdin, container.exited = cmd, stdin, exited
		return u, nil
	case err := <-exited:
		exited <- err
		if err == nil {
			err = errors.New("exited before printing a URL")
		}
		return stop(err)
	case <-time.After(timeout):
		return stop(fmt.Errorf("no URL after %v", timeout))
	}
}

// firstLine sends the first line written to it on ch and discards the rest.
type firstLine struct {
	mu   sync.Mutex
	buf  []byte
	sent bool
	ch   chan string
}

func (f *firstLine) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sent {
		return len(p), nil
	}
	f.buf = append(f.buf, p...)
	if i := bytes.IndexByte(f.buf, '\n'); i >= 0 {
		f.ch <- string(f.buf[:i])
		f.sent, f.buf = true, nil
	}
	return len(p), nil
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
