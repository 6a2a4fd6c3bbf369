package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// Without a Docker engine the program fails with an error that says so and
// prints no URL: internal/testkit/testdb then reports the error and skips (or fails
// under CI). With Docker, internal/testkit/testdb's own tests exercise the happy path.
func TestNoDockerEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	var out bytes.Buffer
	err := run(strings.NewReader(""), &out)
	if err == nil {
		t.Fatal("run succeeded without a Docker engine")
	}
	if !strings.Contains(err.Error(), "docker") {
		t.Errorf("error %q does not name Docker", err)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q without a container", out.String())
	}
}
