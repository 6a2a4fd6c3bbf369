package mysqlstore_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

// galeraBudget is how long the cluster may take to come up
// (TXLIMIT_GALERA_BUDGET, a duration; 3 minutes by default).
func galeraBudget() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TXLIMIT_GALERA_BUDGET")); err == nil {
		return d
	}
	return 3 * time.Minute
}

// galera brings up a three-node MariaDB Galera cluster with
// scripts/galera.sh, stopped when tb ends, and returns one DSN config per
// node. Under CI=true, where .ci/run installs Galera, the test fails when
// the cluster cannot come up (galera-4 or MariaDB missing, not root) or does
// not within galeraBudget, and runs with -short too: it never skips there.
// Elsewhere it skips, saying why and how to run it.
func galera(tb testing.TB) []*mysql.Config {
	tb.Helper()
	const howTo = "run scripts/galera.sh install as root, then go test -run TestGalera ./mysqlstore/"
	if testing.Short() && os.Getenv("CI") != "true" {
		tb.Skip("SKIPPING the Galera test under -short: the cluster takes seconds to a minute and a half to come up; " +
			"go test -run TestGalera ./mysqlstore/ runs it")
	}
	for _, need := range []string{"/usr/sbin/mariadbd", "/usr/lib/galera/libgalera_smm.so"} {
		if _, err := os.Stat(need); err != nil {
			testdb.SkipOrFail(tb, fmt.Sprintf("the Galera test needs %s, which is missing: %s", need, howTo))
		}
	}
	if os.Geteuid() != 0 {
		testdb.SkipOrFail(tb, "the Galera test runs its nodes as the mysql user (scripts/galera.sh), which needs root: "+howTo)
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "scripts", "galera.sh")
	dir, err := os.MkdirTemp("", "txlimit-galera-")
	require.NoError(tb, err)
	tb.Cleanup(func() {
		if out, err := exec.Command(script, "stop", dir).CombinedOutput(); err != nil {
			tb.Errorf("galera.sh stop: %v\n%s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	budget := galeraBudget()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	begun := time.Now()
	cmd := exec.CommandContext(ctx, script, "start", dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		testdb.SkipOrFail(tb, fmt.Sprintf("the Galera cluster did not come up within %v (TXLIMIT_GALERA_BUDGET sets the budget): %v\n%s",
			budget, err, out.String()))
	}
	tb.Logf("Galera: three nodes synced in %v", time.Since(begun).Round(time.Second))
	var nodes []*mysql.Config
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var n, port int
		if _, err := fmt.Sscanf(sc.Text(), "node %d %d", &n, &port); err == nil {
			cfg := mysql.NewConfig()
			cfg.User, cfg.Net, cfg.Addr = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", port)
			nodes = append(nodes, mysqltest.StoreConfig(cfg))
		}
	}
	require.Len(tb, nodes, 3, "galera.sh start printed:\n%s", out.String())
	return nodes
}

// TestGalera drives one limit from all three nodes of a Galera cluster at
// once. Galera's row locks hold only on the node that took them: two nodes
// may each lock and update the same row, and the one that commits second
// fails certification with 1213, its whole transaction rolled back. So every
// call runs in a business transaction (an order, inserted beside the limit)
// retried on 1213, and afterwards the orders are exactly the tokens spent,
// never more than the limit's capacity. It reports the share of attempts
// aborted and the calls per second each node completed, for one hot key
// taken from every node and for keys each routed to one node
// (docs/mysql.md).
func TestGalera(t *testing.T) {
	// In parallel with the package's other tests: most of its time is the
	// cluster coming up, which waits rather than computes.
	t.Parallel()
	nodes := galera(t)
	ctx := context.Background()
	dbs := make([]*sql.DB, len(nodes))
	for i, cfg := range nodes {
		cfg.DBName = "txlimit_galera"
		if i == 0 {
			c := nodes[0].Clone()
			c.DBName = ""
			_, err := mysqltest.Open(t, c, 1).Exec("CREATE DATABASE txlimit_galera")
			require.NoError(t, err)
			require.NoError(t, migrations.Up(ctx, mysqltest.Open(t, cfg, 2), migrations.MySQL))
		}
		dbs[i] = mysqltest.Open(t, cfg, 8)
		createOrdersIfMissing(t, dbs[i])
	}
	const capacity = 300
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		desc string
		key  func(node int) string
	}{
		{"one hot key from every node", func(int) string { return "hot" }},
		{"each key routed to one node", func(node int) string { return fmt.Sprint("node", node) }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			name := "galera " + tc.desc
			limiters := make([]*txlimit.Limiter[*sql.Tx], len(dbs))
			for i, db := range dbs {
				var err error
				limiters[i], err = txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
					name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour},
				}, &txlimit.Options{Clock: func() time.Time { return at }})
				require.NoError(t, err)
			}
			keys := map[string]bool{}
			for n := range dbs {
				keys[tc.key(n)] = true
			}
			// Twice the tokens of every key, asked for by 4 workers per node.
			const workersPerNode = 4
			callsEach := 2 * capacity * len(keys) / (workersPerNode * len(dbs))
			var admitted, denied, attempts, aborted atomic.Int64
			perNode := make([]atomic.Int64, len(dbs))
			var wg sync.WaitGroup
			errs := make(chan error, len(dbs)*workersPerNode)
			begun := time.Now()
			for n, db := range dbs {
				for range workersPerNode {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range callsEach {
							for {
								attempts.Add(1)
								ok, err := galeraCall(ctx, db, limiters[n], name, tc.key(n), n)
								var myErr *mysql.MySQLError
								if errors.As(err, &myErr) && myErr.Number == 1213 {
									aborted.Add(1)
									continue
								}
								if err != nil {
									errs <- err
									return
								}
								if ok {
									admitted.Add(1)
								} else {
									denied.Add(1)
								}
								perNode[n].Add(1)
								break
							}
						}
					}()
				}
			}
			wg.Wait()
			elapsed := time.Since(begun)
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			want := capacity * len(keys)
			require.EqualValues(t, want, admitted.Load(), "exactly the capacity of every key")
			for n, db := range dbs {
				// Every node holds the same orders and the same limit.
				require.NoError(t, waitSynced(ctx, db))
				require.Equal(t, want, countOrders(t, db, name), "orders on node %d", n+1)
				for k := range keys {
					snap, err := limiters[n].Check(ctx, name, k, txlimit.Count(0))
					require.NoError(t, err)
					require.InDelta(t, 0, snap.Remaining, 1e-9, "node %d, key %s: every token spent", n+1, k)
				}
			}
			var rates []string
			for n := range perNode {
				rates = append(rates, fmt.Sprintf("node %d %.0f calls/s", n+1, float64(perNode[n].Load())/elapsed.Seconds()))
			}
			t.Logf("%s: %d calls (%d admitted, %d denied) in %v; %d of %d attempts aborted by certification (%.1f%%); %s",
				tc.desc, admitted.Load()+denied.Load(), admitted.Load(), denied.Load(), elapsed.Round(time.Millisecond),
				aborted.Load(), attempts.Load(), 100*float64(aborted.Load())/float64(attempts.Load()), strings.Join(rates, ", "))
		})
	}
}

// galeraCall runs one business transaction on node's db: an order and the
// limit, committed when the limit admits and rolled back otherwise.
func galeraCall(ctx context.Context, db *sql.DB, l *txlimit.Limiter[*sql.Tx], name, key string, node int) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (name, k) VALUES (?, ?)", name, fmt.Sprint(key, "@", node)); err != nil {
		return false, err
	}
	res, err := l.LimitTx(ctx, tx, name, key)
	if err != nil || !res.OK {
		return false, err
	}
	return true, tx.Commit()
}

// waitSynced waits until db's node has applied every write set the cluster
// committed before the call (wsrep_sync_wait for one read).
func waitSynced(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err != nil {
		return err
	}
	var one int
	err = conn.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	if _, resetErr := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 0"); err == nil {
		err = resetErr
	}
	return err
}

// createOrdersIfMissing creates the orders table once for the cluster.
func createOrdersIfMissing(t *testing.T, db *sql.DB) {
	t.Helper()
	_, err := db.Exec("CREATE TABLE IF NOT EXISTS orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(300) NOT NULL, k VARCHAR(100) NOT NULL)")
	require.NoError(t, err)
}
