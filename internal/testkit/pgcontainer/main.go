// Command pgcontainer starts a throwaway PostgreSQL in Docker for txlimit's
// tests, prints its URL as the first line of its output, and removes the
// container when its stdin closes (or on SIGINT/SIGTERM).
//
// internal/testkit/testdb runs it with `go run .` only when no server is found
// otherwise and a Docker engine answers. It is a module of its own so that
// testcontainers-go and the Docker client it brings stay out of the
// library's go.mod, and out of the module graph of txlimit's users.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Image is the PostgreSQL image the tests run against when there is no
// local server.
const Image = "postgres:16-alpine"

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgcontainer:", err)
		os.Exit(1)
	}
}

// run starts the container, writes its URL to out, waits until in reaches
// EOF or a signal arrives, and removes the container.
func run(in io.Reader, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, url, err := start(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Terminate(ctx)
	}()
	if _, err := fmt.Fprintln(out, url); err != nil {
		return err
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in)
		close(closed)
	}()
	select {
	case <-closed:
	case <-ctx.Done():
	}
	return nil
}

func start(ctx context.Context) (c testcontainers.Container, url string, err error) {
	defer func() {
		if r := recover(); r != nil { // testcontainers panics on some Docker setups
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return nil, "", fmt.Errorf("docker: %w", err)
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return nil, "", fmt.Errorf("docker engine: %w", err)
	}
	c, err = testcontainers.Run(ctx, Image,
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_DB": "test"}),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
	)
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		return nil, "", fmt.Errorf("run %s: %w", Image, err)
	}
	hostPort, err := c.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		_ = c.Terminate(context.Background())
		return nil, "", errors.Join(errors.New("container port"), err)
	}
	return c, "postgres://postgres@" + hostPort + "/test?sslmode=disable", nil
}
