package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

// escrowPoolSize is the size of the escrow store's own pool at a client
// count: the debits of the calls in flight and the settling job run on it,
// never on a connection a client holds. A debit holds its connection for one
// round trip, so the pool need not match the clients one for one; it is
// kept small enough that the clients' pool and this one stay within 50
// connections at 32 clients.
func escrowPoolSize(clients int) int { return min(clients, 14) + 2 }

// pgEscrow is txlimit in escrow mode (Config.Escrow) on PostgreSQL: the
// clients' LimitTx in their own transactions on the clients' pool, as
// pgLimit; the store debits in autocommit and settles on a pool of its own
// (store), so that a debit never waits for a connection a client holds. A
// settling job (Limiter.Settle every settleEvery) runs beside every run of
// its clients, as a user runs it, and reports its cost; the store's own
// background settlement (pgstore.EscrowSettleEvery) is off, so that the job
// does all of it and the report counts it all.
type pgEscrow struct {
	pgLimit
	store       *pgPool
	settleEvery time.Duration
}

func newPgEscrow(clients, store *pgPool, settleEvery time.Duration) pgEscrow {
	if store == nil {
		panic("txlimit-bench: the escrow subject is opened without its store's pool") // b.postgres opens it
	}
	return pgEscrow{
		pgLimit:     pgLimit{p: clients, store: pgstore.New(store.pool, pgstore.EscrowSettleEvery(0)), tune: func(c *txlimit.Config) { c.Escrow = true }},
		store:       store,
		settleEvery: settleEvery,
	}
}

// settleStats is what the settling job did during one run, and the size of
// the escrow tables at its end.
type settleStats struct {
	calls   int           // Settle calls
	rows    int64         // entries settled (spent, refunded, dropped) and orphaned claims deleted
	busy    time.Duration // in Settle
	elapsed time.Duration // from the job's start to its stop
	// entries and claims are the rows of txlimit_escrow and
	// txlimit_escrow_claim when the run's calls had ended, before any
	// further Settle: what steady load leaves behind (every cell of a run
	// shares the tables, so growth shows from cell to cell).
	entries, claims int64
	// The store pool's acquisitions during the run, those that found no
	// idle connection and waited, and the time spent acquiring.
	acquires, waited int64
	acquireTime      time.Duration
}

func (s settleStats) rowsPerSec() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.rows) / s.elapsed.Seconds()
}

func (s settleStats) msPerCall() float64 {
	if s.calls == 0 {
		return 0
	}
	return ms(s.busy) / float64(s.calls)
}

// settling is a subject with a job of its own beside its clients.
type settling interface {
	// startSettling starts the job; stop ends it and reports.
	startSettling(ctx context.Context, spec limitSpec) (stop func() (settleStats, error), err error)
}

// untraced marks the context of the settling job's statements, which the
// tracer leaves out of the calls' round trips and profile.
type untraced struct{}

func (s pgEscrow) startSettling(ctx context.Context, spec limitSpec) (func() (settleStats, error), error) {
	l, err := newLimiter(s.pgLimit.store, spec, s.tune)
	if err != nil {
		return nil, err
	}
	ctx = context.WithValue(ctx, untraced{}, true)
	pool0 := s.store.pool.Stat()
	var (
		st    settleStats
		mu    sync.Mutex
		first error
	)
	done, quit := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(s.settleEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			t0 := time.Now()
			r, err := l.Settle(ctx, 0)
			d := time.Since(t0)
			mu.Lock()
			st.calls++
			st.busy += d
			st.rows += int64(r.Spent + r.Refunded + r.Dropped + r.Orphans)
			if err != nil && first == nil {
				first = fmt.Errorf("the settling job (Limiter.Settle): %w", err)
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return func() (settleStats, error) {
		close(quit)
		<-done
		st.elapsed = time.Since(start)
		pool1 := s.store.pool.Stat()
		st.acquires = pool1.AcquireCount() - pool0.AcquireCount()
		st.waited = pool1.EmptyAcquireCount() - pool0.EmptyAcquireCount()
		st.acquireTime = pool1.AcquireDuration() - pool0.AcquireDuration()
		if first != nil {
			return st, first
		}
		err := s.store.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM txlimit_escrow), (SELECT count(*) FROM txlimit_escrow_claim)`).
			Scan(&st.entries, &st.claims)
		if err != nil {
			return st, fmt.Errorf("count the escrow tables' rows: %w", err)
		}
		return st, nil
	}, nil
}

// isUntraced reports whether ctx belongs to the settling job.
func isUntraced(ctx context.Context) bool { return ctx.Value(untraced{}) != nil }
