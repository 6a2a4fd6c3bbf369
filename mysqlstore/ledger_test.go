package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/mysqlstore"
)

// The ledger: 32 connections call a limit in business transactions, each
// inserting an order, and end them at random: commit, roll back, or die (the
// connection killed from another session before COMMIT, as when the
// application crashes; the server rolls the transaction back). Afterwards
// the orders are exactly the tokens the limit spent, never more than its
// capacity, unsharded and sharded.
//
// The key is new when the storm starts, so its first transactions create
// its rows while others wait for them. When such a creator rolls back (or
// dies), InnoDB removes the rows and leaves each waiter with a lock on the
// gap they were in, and two waiters that then both insert them deadlock:
// InnoDB rolls one back with 1213 (the same happens to plain INSERTs of one
// new key). Those transactions end as rolled back by the server, and the
// ledger holds for them too; docs/mysql.md tells the story. Once the key's
// rows exist (warm), no call may fail.
func TestLedgerWithRollbacksAndKills(t *testing.T) {
	const workers, callsEach, capacity = 32, 6, 60
	ctx := context.Background()
	db := mysqltest.Database(t, workers+2)
	createOrders(t, db)
	admin := mysqltest.Open(t, mysqltest.Config(t), 1)
	for _, tc := range []struct {
		shards int
		// warm: the key's rows exist (committed) before the storm, so no
		// transaction creates them and none may deadlock.
		warm bool
	}{{1, false}, {4, false}, {1, true}, {4, true}} {
		t.Run(fmt.Sprintf("shards=%d/warm=%v", tc.shards, tc.warm), func(t *testing.T) {
			name := t.Name()
			at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{
				name: {Kind: txlimit.TokenBucket, Rate: capacity, Period: time.Hour, Shards: tc.shards},
			}, &txlimit.Options{Clock: func() time.Time { return at }})
			require.NoError(t, err)
			if tc.warm {
				res, err := l.Limit(ctx, name, "hot", txlimit.Count(0))
				require.NoError(t, err)
				require.True(t, res.OK)
			}
			var committed, rolledBack, killed, deadlocked atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers*callsEach)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 27))
					for range callsEach {
						err := ledgerCall(ctx, db, admin, l, name, r.IntN(3), &committed, &rolledBack, &killed)
						var myErr *mysql.MySQLError
						switch {
						case !tc.warm && errors.As(err, &myErr) && myErr.Number == 1213:
							deadlocked.Add(1)
						case err != nil:
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			snap, err := l.Check(ctx, name, "hot", txlimit.Count(0))
			require.NoError(t, err)
			spent := capacity - snap.Remaining
			orders := countOrders(t, db, name)
			t.Logf("%d committed, %d rolled back, %d killed, %d rolled back by the server (1213); %d orders, %v tokens spent",
				committed.Load(), rolledBack.Load(), killed.Load(), deadlocked.Load(), orders, spent)
			require.Positive(t, killed.Load())
			require.InDelta(t, float64(orders), spent, 1e-9, "orders are the tokens spent")
			require.LessOrEqual(t, orders, capacity)
			require.EqualValues(t, committed.Load(), orders)
		})
	}
}

// ledgerCall runs one business transaction and ends it as end says: 0
// commit, 1 roll back, 2 kill the connection.
func ledgerCall(ctx context.Context, db, admin *sql.DB, l *txlimit.Limiter[*sql.Tx], name string, end int,
	committed, rolledBack, killed *atomic.Int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return err
	}
	res, err := l.LimitTx(ctx, tx, name, "hot")
	if err != nil || !res.OK {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (name, k) VALUES (?, 'hot')", name); err != nil {
		return err
	}
	switch end {
	case 0:
		if err := tx.Commit(); err != nil {
			return err
		}
		committed.Add(1)
	case 1:
		if err := tx.Rollback(); err != nil {
			return err
		}
		rolledBack.Add(1)
	default:
		if _, err := admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			return err
		}
		if tx.Commit() == nil {
			return fmt.Errorf("COMMIT succeeded on connection %d, which was killed", id)
		}
		killed.Add(1)
	}
	return nil
}
