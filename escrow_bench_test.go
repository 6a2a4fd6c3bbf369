package txlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
)

// BenchmarkEscrow compares escrow mode with the locked model on a business
// transaction (BEGIN; INSERT; LimitTx; COMMIT), for one hot key and for
// distinct keys (each client its own), at 8 and 32 clients, and logs the
// ratios measured in the same run:
//
//	go test -run '^$' -bench Escrow -benchtime 4000x .
//
// Settle runs every 100 ms during the escrow measurements, as a periodic job
// would. The callers' transactions run on one pool; the store debits and
// settles on a pool of its own (see docs/escrow.md).
func BenchmarkEscrow(b *testing.B) {
	ctx := context.Background()
	schema := testdb.Schema(b)
	admin := testdb.Pool(b, schema, pgx.QueryExecModeCacheStatement, 1)
	_, err := admin.Exec(ctx, "CREATE TABLE business (id bigserial PRIMARY KEY, k text NOT NULL)")
	require.NoError(b, err)
	admin.Close()
	storePool := testdb.Pool(b, schema, pgx.QueryExecModeCacheStatement, 6)
	locked, escrow := benchConfig(1), benchConfig(1)
	escrow.Escrow = true
	l, err := txlimit.New(pgstore.New(storePool, pgstore.EscrowSettleEvery(0)), map[string]txlimit.Config{"locked": locked, "escrow": escrow}, nil)
	require.NoError(b, err)

	tps := map[string]float64{}
	for _, clients := range []int{8, 32} {
		callers := testdb.Pool(b, schema, pgx.QueryExecModeCacheStatement, int32(clients))
		for _, subject := range []struct {
			name string
			hot  bool
		}{{"locked", true}, {"escrow", true}, {"locked", false}, {"escrow", false}} {
			label := fmt.Sprintf("clients=%d/%s/%s", clients, subject.name, map[bool]string{true: "hot", false: "distinct"}[subject.hot])
			b.Run(label, func(b *testing.B) {
				run := fmt.Sprintf("%s#%d", b.Name(), benchRun.Add(1))
				var settleDone chan struct{}
				stop := make(chan struct{})
				if subject.name == "escrow" {
					settleDone = make(chan struct{})
					go func() {
						defer close(settleDone)
						t := time.NewTicker(100 * time.Millisecond)
						defer t.Stop()
						for {
							select {
							case <-stop:
								return
							case <-t.C:
								if _, err := l.Settle(ctx, 0); err != nil {
									b.Error(err)
									return
								}
							}
						}
					}()
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := run + "/hot"
						if !subject.hot {
							key = fmt.Sprintf("%s/%d", run, c)
						}
						for next.Add(1) <= int64(b.N) {
							var res txlimit.Result
							err := pgx.BeginFunc(ctx, callers, func(tx pgx.Tx) error {
								if _, err := tx.Exec(ctx, "INSERT INTO business (k) VALUES ($1)", key); err != nil {
									return err
								}
								var err error
								res, err = l.LimitTx(ctx, tx, subject.name, key)
								return err
							})
							if err != nil {
								b.Error(err)
								return
							}
							if !res.OK {
								b.Errorf("key %q: denied, but the limit admits everything", key)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				close(stop)
				if settleDone != nil {
					<-settleDone
				}
				rate := float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rate, "tx/s")
				tps[label] = rate
			})
		}
		callers.Close()
	}
	res, err := l.Settle(ctx, 0)
	require.NoError(b, err)
	for _, clients := range []int{8, 32} {
		at := func(s string) float64 { return tps[fmt.Sprintf("clients=%d/%s", clients, s)] }
		if at("escrow/hot") == 0 || at("locked/hot") == 0 || at("escrow/distinct") == 0 || at("locked/distinct") == 0 {
			continue
		}
		b.Logf("clients=%d: escrow hot / locked hot = %.2f; escrow hot / escrow distinct = %.2f; locked hot / locked distinct = %.2f; escrow distinct / locked distinct = %.2f",
			clients, at("escrow/hot")/at("locked/hot"), at("escrow/hot")/at("escrow/distinct"),
			at("locked/hot")/at("locked/distinct"), at("escrow/distinct")/at("locked/distinct"))
	}
	b.Logf("after the last Settle: %d escrow calls pending", res.Pending)
}
