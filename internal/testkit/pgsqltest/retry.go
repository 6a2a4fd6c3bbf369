package pgsqltest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// RetryableConnectErrors connects through database/sql, with each of
// drivers, in ways that fail, and checks which failures
// pgsqlstore.Retryable calls transient: the same as pgstore's
// TestRetryableConnectErrors. Each failure is seen three ways: from the
// limiter's own transaction (Limit), from RunTx (which gives up after
// RunTxAttempts runs only when the failure is retryable), and, with pgx,
// from the application's own db.BeginTx, where pgx's *pgconn.ConnectError
// alone says that the connection failed. The subtests are parallel, named
// driver name/case.
func RetryableConnectErrors(t *testing.T, drivers []Driver) {
	ctx := context.Background()
	base, err := url.Parse(testdb.URL(t))
	require.NoError(t, err)
	closed := closedPort(t)
	for _, c := range []struct {
		name   string
		change func(u *url.URL)
		want   bool
	}{
		// The primary, asked for a standby: what a client sees while a
		// failover moves the roles (and "read only" for the opposite).
		{"WrongRole", func(u *url.URL) { setParam(u, "target_session_attrs", "standby") }, true},
		{"Refused", func(u *url.URL) { u.Host = closed }, true},
		{"NoSuchDatabase", func(u *url.URL) { u.Path = "/txlimit_no_such_database" }, false},
		{"NoSuchRole", func(u *url.URL) { u.User = url.User("txlimit_no_such_role") }, false},
	} {
		for _, driverName := range driverNames(drivers) {
			t.Run(driverName+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				u := *base
				c.change(&u)
				db, err := sql.Open(driverName, u.String())
				require.NoError(t, err)
				defer db.Close()

				l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
					"connect": {Kind: txlimit.TokenBucket, Rate: 1, Period: time.Hour},
				}, nil)
				require.NoError(t, err)
				_, err = l.Limit(ctx, "connect", "k")
				require.Error(t, err)
				require.Equal(t, c.want, pgsqlstore.Retryable(err), "Limit: %v", err)

				runs := 0
				err = pgsqlstore.RunTx(ctx, db, nil, func(*sql.Tx) error { runs++; return nil })
				require.Error(t, err)
				require.Zero(t, runs)
				gaveUp := fmt.Sprintf("gave up after %d attempts", pgsqlstore.RunTxAttempts)
				if c.want {
					require.ErrorContains(t, err, gaveUp)
				} else {
					require.NotContains(t, err.Error(), gaveUp)
				}

				if driverName == "pgx" {
					tx, err := db.BeginTx(ctx, nil)
					if err == nil {
						_ = tx.Rollback()
					}
					require.Error(t, err)
					require.Equal(t, c.want, pgsqlstore.Retryable(err), "BeginTx: %v", err)
				}
			})
		}
	}
}

// driverNames are the database/sql driver names of drivers, each once.
func driverNames(drivers []Driver) []string {
	var out []string
	for _, d := range drivers {
		if len(out) == 0 || out[len(out)-1] != d.Name {
			out = append(out, d.Name)
		}
	}
	return out
}

// closedPort is an address on 127.0.0.1, in 7200–7299, that nothing listens
// on: one this test could listen on, closed again.
func closedPort(t *testing.T) string {
	for port := 7200; port < 7300; port++ {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		require.NoError(t, ln.Close())
		return addr
	}
	t.Fatal("no free port in 7200–7299")
	return ""
}

func setParam(u *url.URL, key, value string) {
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
}
