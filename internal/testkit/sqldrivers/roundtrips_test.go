package sqldrivers

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgsqlstore"
)

// TestLibPQRoundTrips counts, on the wire, the round trips of a transaction
// around LimitTx with lib/pq (the server's ReadyForQuery messages): with
// binary_parameters=yes an admitted call is as many as with pgx (BEGIN,
// the one statement, COMMIT; a sharded call four statements between them),
// without it each statement with parameters costs two, as pgsqlstore's doc
// says.
func TestLibPQRoundTrips(t *testing.T) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	for _, c := range []struct {
		name                string
		binaryParameters    bool
		unsharded, shards16 int
	}{
		{"binary_parameters", true, 1, 4},
		{"default", false, 2, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := url.Parse(testdb.URL(t))
			require.NoError(t, err)
			q := u.Query()
			q.Set("search_path", schema)
			if c.binaryParameters {
				q.Set("binary_parameters", "yes")
			}
			u.RawQuery = q.Encode()
			counter := &testdb.ReadyCounter{}
			connector, err := pq.NewConnector(u.String())
			require.NoError(t, err)
			connector.Dialer(countingDialer{counter})
			db := sql.OpenDB(connector)
			defer db.Close()
			l, err := txlimit.New(pgsqlstore.New(db), map[string]txlimit.Config{
				"unsharded": {Kind: txlimit.TokenBucket, Rate: 1e12, Period: time.Hour},
				"shards16":  {Kind: txlimit.TokenBucket, Rate: 1e12, Period: time.Hour, Shards: 16},
			}, nil)
			require.NoError(t, err)
			for _, limit := range []struct {
				name  string
				trips int
			}{{"unsharded", c.unsharded}, {"shards16", c.shards16}} {
				for i := range 4 {
					counter.Take()
					tx, err := db.BeginTx(ctx, nil)
					require.NoError(t, err)
					begin := counter.Take()
					res, err := l.LimitTx(ctx, tx, limit.name, "k")
					require.NoError(t, err)
					require.True(t, res.OK)
					call := counter.Take()
					require.NoError(t, tx.Commit())
					commit := counter.Take()
					if i == 0 {
						continue // the first call of a key creates its rows
					}
					require.Equal(t, [3]int{1, limit.trips, 1}, [3]int{begin, call, commit},
						"%s, call %d: round trips of BEGIN, LimitTx, COMMIT", limit.name, i)
				}
			}
		})
	}
}

// countingDialer is a pq.Dialer whose connections feed what they read to a
// testdb.ReadyCounter (the test's DSN has sslmode=disable, so it is plain).
type countingDialer struct{ c *testdb.ReadyCounter }

func (d countingDialer) Dial(network, addr string) (net.Conn, error) {
	return d.DialTimeout(network, addr, 0)
}

func (d countingDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return d.c.Conn(conn), nil
}
