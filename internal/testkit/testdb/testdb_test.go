package testdb

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeSearch records which steps of the search ran.
type fakeSearch struct {
	env       map[string]string
	up        map[string]bool // servers that answer a ping
	dockerErr error
	contURL   string
	contErr   error
	calls     []string
}

func (f *fakeSearch) finder() finder {
	return finder{
		getenv: func(k string) string { return f.env[k] },
		ping: func(u string) error {
			f.calls = append(f.calls, "ping "+u)
			if f.up[u] {
				return nil
			}
			return errors.New("connection refused")
		},
		docker: func() error {
			f.calls = append(f.calls, "docker")
			return f.dockerErr
		},
		container: func() (string, error) {
			f.calls = append(f.calls, "container")
			return f.contURL, f.contErr
		},
	}
}

func TestFindOrder(t *testing.T) {
	const envURL = "postgres://u@db.example:5432/x"
	const contURL = "postgres://postgres@127.0.0.1:32768/test?sslmode=disable"
	noDocker := errors.New("no socket")
	tests := []struct {
		name       string
		search     fakeSearch
		wantURL    string
		wantSource string // substring
		wantErr    string // substring; "" means no error
		wantCalls  []string
	}{{
		name:       "TEST_DATABASE_URL first",
		search:     fakeSearch{env: map[string]string{"TEST_DATABASE_URL": envURL}, up: map[string]bool{envURL: true, LocalURL: true}},
		wantURL:    envURL,
		wantSource: "TEST_DATABASE_URL",
		wantCalls:  []string{"ping " + envURL},
	}, {
		name:      "TEST_DATABASE_URL unreachable is an error, not a fallback",
		search:    fakeSearch{env: map[string]string{"TEST_DATABASE_URL": envURL}, up: map[string]bool{LocalURL: true}},
		wantErr:   "TEST_DATABASE_URL is set but unreachable",
		wantCalls: []string{"ping " + envURL},
	}, {
		name:       "local server second",
		search:     fakeSearch{up: map[string]bool{LocalURL: true}},
		wantURL:    LocalURL,
		wantSource: "TEST_DATABASE_URL is unset: the local server",
		wantCalls:  []string{"ping " + LocalURL},
	}, {
		name:      "no Docker engine: no container is started",
		search:    fakeSearch{dockerErr: noDocker},
		wantErr:   "no Docker engine for a container (no socket)",
		wantCalls: []string{"ping " + LocalURL, "docker"},
	}, {
		name:       "container only when Docker answers",
		search:     fakeSearch{up: map[string]bool{contURL: true}, contURL: contURL},
		wantURL:    contURL,
		wantSource: "a Docker container",
		wantCalls:  []string{"ping " + LocalURL, "docker", "container", "ping " + contURL},
	}, {
		name:      "container program fails",
		search:    fakeSearch{contErr: errors.New("pull denied")},
		wantErr:   "no container: pull denied",
		wantCalls: []string{"ping " + LocalURL, "docker", "container"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, source, err := tt.search.finder().find()
			if tt.wantErr == "" {
				if err != nil || u != tt.wantURL || !strings.Contains(source, tt.wantSource) {
					t.Fatalf("find() = %q, %q, %v; want %q from %q", u, source, err, tt.wantURL, tt.wantSource)
				}
			} else if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("find() = %q, %v; want an error containing %q", u, err, tt.wantErr)
			}
			if got, want := strings.Join(tt.search.calls, ", "), strings.Join(tt.wantCalls, ", "); got != want {
				t.Errorf("steps: %s\nwant:  %s", got, want)
			}
		})
	}
}

// dockerLike serves GET /_ping like a Docker engine on a unix socket.
func dockerLike(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_ping" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "OK")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func TestDockerEngine(t *testing.T) {
	sock := dockerLike(t)
	tcp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "OK") }))
	defer tcp.Close()
	dead := filepath.Join(t.TempDir(), "dead.sock")
	deadTCP := func() string { // a port nothing listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}()

	tests := []struct {
		name    string
		env     map[string]string
		answers bool
	}{
		{"DOCKER_HOST unix socket that answers", map[string]string{"DOCKER_HOST": "unix://" + sock}, true},
		{"DOCKER_HOST unix socket that does not exist", map[string]string{"DOCKER_HOST": "unix://" + dead}, false},
		{"DOCKER_HOST tcp that answers", map[string]string{"DOCKER_HOST": "tcp://" + strings.TrimPrefix(tcp.URL, "http://")}, true},
		{"DOCKER_HOST tcp that refuses", map[string]string{"DOCKER_HOST": "tcp://" + deadTCP}, false},
		{"DOCKER_HOST wins over a socket that answers", map[string]string{"DOCKER_HOST": "unix://" + dead, "XDG_RUNTIME_DIR": filepath.Dir(sock)}, false},
		{"rootless socket in XDG_RUNTIME_DIR", map[string]string{"XDG_RUNTIME_DIR": filepath.Dir(sock)}, true},
		{"DOCKER_HOST scheme that cannot be probed", map[string]string{"DOCKER_HOST": "ssh://user@host"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := dockerEngine(func(k string) string { return tt.env[k] })
			if tt.answers && err != nil {
				t.Fatalf("dockerEngine: %v; want an engine", err)
			}
			if !tt.answers && err == nil {
				t.Fatal("dockerEngine found an engine; want an error")
			}
		})
	}
}

// With DOCKER_HOST unset and every socket absent (the system one moved to
// an empty directory, so that a machine's own engine does not answer), the
// search ends before any container program is run.
func TestNoDockerNoContainer(t *testing.T) {
	home := t.TempDir()
	system := systemDockerSocket
	systemDockerSocket = filepath.Join(home, "docker.sock")
	t.Cleanup(func() { systemDockerSocket = system })
	err := dockerEngine(func(k string) string {
		return map[string]string{"HOME": home, "XDG_RUNTIME_DIR": home}[k]
	})
	if err == nil {
		t.Fatal("dockerEngine found an engine; want an error")
	}
	if !strings.Contains(err.Error(), "no Docker socket answers") {
		t.Errorf("error %q does not say no socket answers", err)
	}
}

// tbRecorder records Skip and Fatalf instead of ending the test.
type tbRecorder struct {
	testing.TB
	skipped, fatal string
}

func (r *tbRecorder) Helper()                        {}
func (r *tbRecorder) Skip(args ...any)               { r.skipped = fmt.Sprint(args...) }
func (r *tbRecorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *tbRecorder) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }

func TestMissingServer(t *testing.T) {
	err := errors.New("no server at 127.0.0.1:5432")

	r := &tbRecorder{TB: t}
	missing(r, err, false)
	if r.fatal != "" || !strings.HasPrefix(r.skipped, "SKIPPING PostgreSQL tests: no server at 127.0.0.1:5432") ||
		!strings.Contains(r.skipped, "set TEST_DATABASE_URL") {
		t.Errorf("CI unset: skipped %q, fatal %q; want a skip that says how to provide a server", r.skipped, r.fatal)
	}

	r = &tbRecorder{TB: t}
	missing(r, err, true)
	if r.skipped != "" || !strings.Contains(r.fatal, "required under CI=true") {
		t.Errorf("CI=true: skipped %q, fatal %q; want a failure", r.skipped, r.fatal)
	}
}

func TestLaunch(t *testing.T) {
	const url = "postgres://postgres@127.0.0.1:1/test"
	t.Run("URL, then lives until stdin closes", func(t *testing.T) {
		// cat holds the process until launch's stdin pipe closes.
		cmd := exec.Command("sh", "-c", "echo "+url+"; cat >/dev/null; echo bye >&2")
		got, err := launch(cmd, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got != url {
			t.Fatalf("url %q, want %q", got, url)
		}
		select {
		case err := <-container.exited:
			t.Fatalf("the program exited (%v) although its stdin is open", err)
		case <-time.After(100 * time.Millisecond):
		}
		_ = container.stdin.Close()
		select {
		case err := <-container.exited:
			if err != nil {
				t.Fatalf("the program failed after its stdin closed: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the program did not exit after its stdin closed")
		}
		container.cmd, container.stdin, container.exited = nil, nil, nil
	})
	t.Run("exits without a URL", func(t *testing.T) {
		_, err := launch(exec.Command("sh", "-c", "echo 'docker: no engine' >&2; exit 1"), 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), "docker: no engine") {
			t.Fatalf("err %v; want the program's stderr", err)
		}
	})
	t.Run("prints something else", func(t *testing.T) {
		_, err := launch(exec.Command("sh", "-c", "echo hello; cat >/dev/null"), 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), "not a postgres:// URL") {
			t.Fatalf("err %v; want a bad-first-line error", err)
		}
	})
	t.Run("times out", func(t *testing.T) {
		_, err := launch(exec.Command("sh", "-c", "cat >/dev/null"), 200*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "no URL after") {
			t.Fatalf("err %v; want a timeout", err)
		}
	})
}
