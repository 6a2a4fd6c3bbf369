package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/pgstore"
)

// escrowEnv is a schema with two pools: callers' transactions run on
// callers, the store debits and settles on its own pool, so that callers
// holding every connection of theirs never starve the debit.
type escrowEnv struct {
	callers *pgxpool.Pool
	store   *pgstore.Store
	storeDB *pgxpool.Pool
}

func newEscrowEnv(t *testing.T, mode pgx.QueryExecMode, callers int32) escrowEnv {
	schema := testdb.Schema(t)
	storePool := testdb.Pool(t, schema, mode, 6)
	return escrowEnv{
		callers: testdb.Pool(t, schema, mode, callers),
		store:   pgstore.New(storePool, pgstore.EscrowSettleEvery(0)),
		storeDB: storePool,
	}
}

// escrowRows returns the number of pending entries and claims.
func (e escrowEnv) escrowRows(t *testing.T) (pending, claims int) {
	t.Helper()
	require.NoError(t, e.storeDB.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM txlimit_escrow), (SELECT count(*) FROM txlimit_escrow_claim)").Scan(&pending, &claims))
	return pending, claims
}

func escrowLimiter(t *testing.T, store driver.Store[pgx.Tx], limits map[string]txlimit.Config, clk func() time.Time) *txlimit.Limiter[pgx.Tx] {
	t.Helper()
	var opts *txlimit.Options
	if clk != nil {
		opts = &txlimit.Options{Clock: clk}
	}
	l, err := txlimit.New(store, limits, opts)
	require.NoError(t, err)
	return l
}

// escrowTx runs LimitTx in a transaction of its own on pool and commits it
// (or rolls it back when commit is false).
func escrowTx(t *testing.T, pool *pgxpool.Pool, l *txlimit.Limiter[pgx.Tx], name, key string, commit bool, opts ...txlimit.Option) txlimit.Result {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	res, err := l.LimitTx(ctx, tx, name, key, opts...)
	require.NoError(t, err)
	if commit {
		require.NoError(t, tx.Commit(ctx))
	}
	return res
}

// TestEscrowLimitAll: LimitAllTx mixes escrow and locked limits, all or
// nothing. A grant takes from both; a locked limit that denies cancels the
// escrow call (its token comes back at settlement); an escrow limit that
// denies leaves the locked limit untouched, its Result read as Check would.
// LimitAll, in a transaction of its own, takes the escrow limit locked.
func TestEscrowLimitAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 2)
	esc, locked := storetest.UniqueName(t, "esc"), storetest.UniqueName(t, "locked")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		esc:    {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour, Escrow: true},
		locked: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour},
	}, func() time.Time { return storetest.T0 })
	all := func(escCount, lockedCount float64) txlimit.MultiResult {
		t.Helper()
		tx, err := env.callers.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		res, err := l.LimitAllTx(ctx, tx, txlimit.Request{Name: locked, Key: "k", Options: []txlimit.Option{txlimit.Count(lockedCount)}}, txlimit.Request{Name: esc, Key: "k", Options: []txlimit.Option{txlimit.Count(escCount)}})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return res
	}
	values := func() (float64, float64) {
		t.Helper()
		_, err := l.Settle(ctx, 0)
		require.NoError(t, err)
		e, err := l.Value(ctx, esc, "k")
		require.NoError(t, err)
		k, err := l.Value(ctx, locked, "k")
		require.NoError(t, err)
		return e.Value, k.Value
	}

	res := all(1, 1)
	require.True(t, res.OK)
	e, k := values()
	require.Equal(t, []float64{1, 2}, []float64{e, k}, "a grant takes from both")

	res = all(1, 3) // the locked limit has 2
	require.False(t, res.OK)
	require.True(t, res.Results[1].OK, "the escrow limit alone granted")
	require.False(t, res.Results[0].OK)
	e, k = values()
	require.Equal(t, []float64{1, 2}, []float64{e, k}, "the cancelled escrow call's token came back; the locked limit is untouched")

	res = all(2, 1) // the escrow limit has 1
	require.False(t, res.OK)
	require.False(t, res.Results[1].OK)
	require.True(t, res.Results[0].OK, "the locked limit alone would grant (read as Check does)")
	require.Equal(t, 2.0, res.Results[0].Remaining, "and was not taken")
	e, k = values()
	require.Equal(t, []float64{1, 2}, []float64{e, k})

	m, err := l.LimitAll(ctx, txlimit.Request{Name: esc, Key: "k"}, txlimit.Request{Name: locked, Key: "k"})
	require.NoError(t, err)
	require.True(t, m.OK)
	e, k = values()
	require.Equal(t, []float64{0, 1}, []float64{e, k}, "LimitAll takes the escrow limit in its own transaction")
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
}

// TestEscrowLimitAllConcurrentExact: 32 callers on one escrow key (Capacity
// 100) and one locked key (Capacity 70) in LimitAllTx, frozen clock: the
// locked limit binds, so exactly 70 calls commit, and once settled the
// escrow limit has given back every token of the calls the locked limit
// denied: 30 left.
func TestEscrowLimitAllConcurrentExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 8)
	esc, locked := storetest.UniqueName(t, "esc"), storetest.UniqueName(t, "locked")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		esc:    {Kind: txlimit.TokenBucket, Rate: 100, Period: time.Hour, Escrow: true},
		locked: {Kind: txlimit.TokenBucket, Rate: 70, Period: time.Hour},
	}, func() time.Time { return storetest.T0 })
	var committed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				err := pgx.BeginFunc(ctx, env.callers, func(tx pgx.Tx) error {
					res, err := l.LimitAllTx(ctx, tx, txlimit.Request{Name: esc, Key: ""}, txlimit.Request{Name: locked, Key: ""})
					if err == nil && res.OK {
						committed.Add(1)
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 70, committed.Load())
	_, err := l.Settle(ctx, 0)
	require.NoError(t, err)
	e, err := l.Value(ctx, esc, "")
	require.NoError(t, err)
	k, err := l.Value(ctx, locked, "")
	require.NoError(t, err)
	require.Equal(t, 30.0, e.Value, "every call the locked limit denied gave its escrow token back")
	require.Equal(t, 0.0, k.Value)
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
}

// TestEscrowBasics walks one key through the operations, with a frozen
// clock: the same decisions as the locked model, Value and Check see the
// escrowed tokens as taken, Credit and Reset work, and the escrow tables
// empty once settled.
func TestEscrowBasics(t *testing.T) {
	t.Parallel()
	for _, mode := range testdb.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := newEscrowEnv(t, mode, 4)
			clk := storetest.NewClock()
			name, lockedName := storetest.UniqueName(t, "esc"), storetest.UniqueName(t, "locked")
			base := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute}
			esc := base
			esc.Escrow = true
			l := escrowLimiter(t, env.store, map[string]txlimit.Config{name: esc, lockedName: base}, clk.Now)
			require.NoError(t, l.Ping(ctx))

			for i := range 10 {
				res := escrowTx(t, env.callers, l, name, "u", true)
				want := escrowTx(t, env.callers, l, lockedName, "u", true)
				require.True(t, res.OK, "call %d", i)
				require.Equal(t, want.Remaining, res.Remaining)
				require.Equal(t, want.NextToken, res.NextToken)
			}
			res := escrowTx(t, env.callers, l, name, "u", true)
			want := escrowTx(t, env.callers, l, lockedName, "u", true)
			require.False(t, res.OK)
			require.Equal(t, 6*time.Second, res.RetryAfter)
			require.Equal(t, want, withName(res, lockedName))

			// Settle: every call so far has ended.
			_, err := l.Settle(ctx, 0)
			require.NoError(t, err)
			pending, claims := env.escrowRows(t)
			require.Zero(t, pending)
			require.Zero(t, claims)

			// Escrowed tokens count as taken while the taker is open.
			clk.Advance(time.Minute) // full again: 10
			tx, err := env.callers.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			res, err = l.LimitTx(ctx, tx, name, "u", txlimit.Count(4))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, 6.0, res.Remaining)
			snap, err := l.Value(ctx, name, "u")
			require.NoError(t, err)
			require.Equal(t, 6.0, snap.Value)
			chk, err := l.Check(ctx, name, "u", txlimit.Count(7))
			require.NoError(t, err)
			require.False(t, chk.OK)
			pending, claims = env.escrowRows(t)
			require.Equal(t, 1, pending)
			require.Equal(t, 0, claims, "the claim is not visible before its transaction commits")
			require.NoError(t, tx.Commit(ctx))

			// Settled as spent: the tokens stay taken, the rows go.
			s, err := l.Settle(ctx, 0)
			require.NoError(t, err)
			require.Equal(t, 1, s.Spent)
			require.Zero(t, s.Refunded)
			require.Zero(t, s.Pending)
			snap, err = l.Value(ctx, name, "u")
			require.NoError(t, err)
			require.Equal(t, 6.0, snap.Value)
			pending, claims = env.escrowRows(t)
			require.Zero(t, pending)
			require.Zero(t, claims)

			// Credit gives back, capped at Capacity; Reset fills.
			require.NoError(t, l.Credit(ctx, name, "u", 3))
			snap, err = l.Value(ctx, name, "u")
			require.NoError(t, err)
			require.Equal(t, 9.0, snap.Value)
			require.True(t, escrowTx(t, env.callers, l, name, "u", true, txlimit.Count(9)).OK)
			require.False(t, escrowTx(t, env.callers, l, name, "u", true).OK)
			require.NoError(t, l.Reset(ctx, name, "u"))
			require.True(t, escrowTx(t, env.callers, l, name, "u", true, txlimit.Count(10)).OK)

			// A reservation goes into debt as in the locked model.
			r := escrowTx(t, env.callers, l, name, "u", true, txlimit.Count(3), txlimit.Reserve())
			require.True(t, r.Reserved())
			require.Equal(t, 18*time.Second, r.RetryAfter)
			require.Equal(t, -3.0, r.Remaining)

			_, err = l.Settle(ctx, 0)
			require.NoError(t, err)
			pending, claims = env.escrowRows(t)
			require.Zero(t, pending)
			require.Zero(t, claims)
		})
	}
}

func withName(r txlimit.Result, name string) txlimit.Result {
	r.Name = name
	return r
}

// TestEscrowRollbackReturnsTokens: a whole transaction rolled back and a
// savepoint rolled back around the call both give the tokens back, to the
// very next call of the key (which settles them before it decides).
func TestEscrowRollbackReturnsTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 2)
	clk := storetest.NewClock()
	name := storetest.UniqueName(t, "rollback")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.FixedWindow, Rate: 1, Period: time.Hour, Escrow: true},
	}, clk.Now)

	// The whole transaction rolls back.
	require.True(t, escrowTx(t, env.callers, l, name, "k", false).OK)
	require.True(t, escrowTx(t, env.callers, l, name, "k", true).OK, "the next call gets the token back")
	require.False(t, escrowTx(t, env.callers, l, name, "k", true).OK, "and only once")

	// A savepoint around the call rolls back; the transaction commits.
	clk.Advance(time.Hour)
	tx, err := env.callers.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "CREATE TEMP TABLE IF NOT EXISTS work (id int)")
	require.NoError(t, err)
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	res, err := l.LimitTx(ctx, sp, name, "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, sp.Rollback(ctx))
	require.NoError(t, tx.Commit(ctx))
	require.True(t, escrowTx(t, env.callers, l, name, "k", true).OK, "the next call gets the token back")
	require.False(t, escrowTx(t, env.callers, l, name, "k", true).OK)

	// Settle also returns them, without another call of the key.
	clk.Advance(time.Hour)
	require.True(t, escrowTx(t, env.callers, l, name, "k", false).OK)
	s, err := l.Settle(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, s.Refunded)
	require.Equal(t, 1.0, s.Tokens)
	snap, err := l.Value(ctx, name, "k")
	require.NoError(t, err)
	require.Equal(t, 1.0, snap.Value)
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
}

// TestEscrowConcurrentExact: 32 callers, each in its own transaction (8
// open at once, on a pool of 8 connections, as in the conformance suite:
// every server connection costs the run about 40 ms of CPU on a small VM),
// on one key with a frozen clock, under every isolation level and exec
// mode: exactly Capacity calls are granted and committed.
// Some callers roll back after a grant: their tokens return, and in the end
// the granted-and-committed calls are exactly Capacity.
func TestEscrowConcurrentExact(t *testing.T) {
	t.Parallel()
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for _, mode := range testdb.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			env := newEscrowEnv(t, mode, 8)
			for _, iso := range levels {
				t.Run(string(iso), func(t *testing.T) {
					runEscrowConcurrent(t, env, iso)
				})
			}
		})
	}
}

// TestEscrowStorePoolIsolation: a store whose pool's transactions default to
// REPEATABLE READ or SERIALIZABLE (default_transaction_isolation) stays
// exact under 16 concurrent callers: its lean debits, which run alone at the
// pool's default, grant only at READ COMMITTED, and the store then sends
// them inside BEGIN ISOLATION LEVEL READ COMMITTED (alone at a stricter
// level, concurrent debits of one row would fail with 40001).
func TestEscrowStorePoolIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			storePool := testdb.PoolParams(t, schema, pgx.QueryExecModeCacheStatement, 4,
				map[string]string{"default_transaction_isolation": level})
			env := escrowEnv{
				callers: testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8),
				store:   pgstore.New(storePool, pgstore.EscrowSettleEvery(0)),
				storeDB: storePool,
			}
			// 16 callers, 8 in flight: enough to make the debits of one
			// row meet, fewer connections than the 32-caller tests.
			runEscrowConcurrentN(t, env, pgx.ReadCommitted, 16, 8, 60)
		})
	}
}

// runEscrowConcurrent: 32 callers, 5 calls each, on 100 tokens: demand
// well above supply, so that the grants, the rollbacks' refunds and the
// denials meet at the boundary.
func runEscrowConcurrent(t *testing.T, env escrowEnv, iso pgx.TxIsoLevel) {
	runEscrowConcurrentN(t, env, iso, 32, 5, 100)
}

// runEscrowConcurrentN: clients callers make calls calls each on one key of
// capacity tokens, every fifth grant rolled back.
func runEscrowConcurrentN(t *testing.T, env escrowEnv, iso pgx.TxIsoLevel, clients, calls, capacity int) {
	ctx := context.Background()
	frozen := storetest.T0
	name := storetest.UniqueName(t, "hot")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: float64(capacity), Period: time.Hour, Escrow: true},
	}, func() time.Time { return frozen })
	var committed, rolledBack atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				err := func() error {
					tx, err := env.callers.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					res, err := l.LimitTx(ctx, tx, name, "")
					if err != nil {
						return err
					}
					if !res.OK {
						return nil
					}
					if (c+i)%5 == 0 {
						rolledBack.Add(1)
						return tx.Rollback(ctx)
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					committed.Add(1)
					return nil
				}()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	_, err := l.Settle(ctx, 0)
	require.NoError(t, err)
	snap, err := l.Value(ctx, name, "")
	require.NoError(t, err)
	require.LessOrEqual(t, committed.Load(), int64(capacity), "never over-admit")
	require.Equal(t, float64(capacity)-float64(committed.Load()), snap.Value, "every committed call spent one token, every other gave it back")
	// Take what is left: exactly Capacity committed in all.
	for snap.Value > 0 {
		require.True(t, escrowTx(t, env.callers, l, name, "", true).OK)
		committed.Add(1)
		snap.Value--
	}
	require.False(t, escrowTx(t, env.callers, l, name, "", true).OK)
	require.Equal(t, int64(capacity), committed.Load())
	t.Logf("%s: %d rolled back after a grant", iso, rolledBack.Load())
	_, err = l.Settle(ctx, 0)
	require.NoError(t, err)
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
}

// TestEscrowCallerDies: callers whose connection is killed (their backend
// terminated) in the middle of the transaction, after the escrow call,
// lose or duplicate nothing: after settlement, the business rows that
// committed equal the tokens the limit lost.
func TestEscrowCallerDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 16)
	_, err := env.callers.Exec(ctx, "CREATE TABLE business (id bigserial PRIMARY KEY, worker int)")
	require.NoError(t, err)
	const clients, calls, capacity = 16, 20, 120
	name := storetest.UniqueName(t, "dies")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.FixedWindow, Rate: capacity, Period: time.Hour, Escrow: true},
	}, func() time.Time { return storetest.T0 })
	var killed atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				func() {
					conn, err := env.callers.Acquire(ctx)
					if err != nil {
						return
					}
					defer conn.Release()
					tx, err := conn.Begin(ctx)
					if err != nil {
						return
					}
					defer tx.Rollback(ctx)
					if _, err := tx.Exec(ctx, "INSERT INTO business (worker) VALUES ($1)", c); err != nil {
						return
					}
					res, err := l.LimitTx(ctx, tx, name, "")
					if err != nil || !res.OK {
						return
					}
					if (c*calls+i)%7 == 3 {
						// The process dies: its backend goes, mid-transaction.
						pid := conn.Conn().PgConn().PID()
						_, err := env.storeDB.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
						if err == nil {
							killed.Add(1)
						}
					}
					_ = tx.Commit(ctx)
				}()
			}
		}()
	}
	wg.Wait()
	_, err = l.Settle(ctx, 0)
	require.NoError(t, err)
	var rows int
	require.NoError(t, env.storeDB.QueryRow(ctx, "SELECT count(*) FROM business").Scan(&rows))
	snap, err := l.Value(ctx, name, "")
	require.NoError(t, err)
	require.Positive(t, killed.Load())
	require.Equal(t, float64(rows), capacity-snap.Value, "committed business rows equal the tokens spent")
	require.LessOrEqual(t, rows, capacity)
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
	t.Logf("%d callers killed, %d business rows, %v tokens left", killed.Load(), rows, snap.Value)
}

// TestEscrowDebitMatchesAlgo holds the SQL of the escrow debit to algo.Take:
// random states, clocks (ahead of and behind the row), counts and
// reservations, on both kinds. EscrowTake fails when its SQL and algo
// disagree on the decision; here the stored state must also be algo's,
// bit for bit.
func TestEscrowDebitMatchesAlgo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 2)
	rng := rand.New(rand.NewPCG(15, 1986))
	now := storetest.T0
	for i := range 400 {
		kind := txlimit.TokenBucket
		if i%2 == 1 {
			kind = txlimit.FixedWindow
		}
		cfg := txlimit.Config{
			Kind: kind, Rate: []float64{1, 3, 7.5, 100, 0.3}[rng.IntN(5)],
			Period:   []time.Duration{time.Second, time.Minute, 7 * time.Millisecond, time.Hour}[rng.IntN(4)],
			Capacity: []float64{0, 1, 10, 2.5, 1000}[rng.IntN(5)], Escrow: true,
		}
		if rng.IntN(3) == 0 {
			cfg.MaxReserved = []float64{1, 5, 50}[rng.IntN(3)]
		}
		if kind == txlimit.FixedWindow {
			cfg.Start = storetest.T0.Add(-time.Duration(rng.IntN(1000)) * time.Millisecond)
		}
		name := fmt.Sprintf("%s/%d", storetest.UniqueName(t, "diff"), i)
		l := escrowLimiter(t, env.store, map[string]txlimit.Config{name: cfg}, func() time.Time { return now })
		nc, _ := l.Config(name)
		capacity := nc.Capacity
		value := capacity * (rng.Float64()*1.4 - 0.4)
		ts := storetest.T0.Add(time.Duration(rng.IntN(20_000_000)-10_000_000) * time.Microsecond)
		if kind == txlimit.FixedWindow {
			// A window start aligned to Start, as the library writes it.
			period := nc.Period.Microseconds()
			off := (ts.UnixMicro() - nc.Start.UnixMicro()) % period
			if off < 0 {
				off += period
			}
			ts = time.UnixMicro(ts.UnixMicro() - off)
		}
		ac := algo.Config{Kind: algo.Kind(kind), Rate: nc.Rate, Period: nc.Period.Microseconds(), Capacity: capacity, MaxReserved: nc.MaxReserved}
		// One key in six has no row: the debit starts from a full one
		// (the lean statements create it, EscrowDebit has it created).
		missing := rng.IntN(6) == 0
		if missing {
			full := algo.Full(ac, nc.Start.UnixMicro())
			value, ts = full.Value, time.UnixMicro(full.TS)
		} else {
			_, err := env.storeDB.Exec(ctx, "INSERT INTO txlimit (name, key, shard, value, ts) VALUES ($1, '', 0, $2, $3)", name, value, ts)
			require.NoError(t, err)
		}
		count := []float64{0, 0.5, 1, 2, 3, 10}[rng.IntN(6)]
		reserve := rng.IntN(3) == 0
		if count > capacity && !reserve {
			count = capacity
		}
		if reserve && cfg.MaxReserved > 0 && count > capacity+cfg.MaxReserved {
			count = capacity
		}
		opts := []txlimit.Option{txlimit.Count(count)}
		if reserve {
			opts = append(opts, txlimit.Reserve())
		}
		res := escrowTx(t, env.callers, l, name, "", true, opts...)
		next, d := algo.Take(ac, algo.State{Value: value, TS: ts.UnixMicro()}, now.UnixMicro(), count, reserve)
		require.Equal(t, d.OK, res.OK, "case %d", i)
		require.Equal(t, time.Duration(d.RetryAfter)*time.Microsecond, res.RetryAfter, "case %d", i)
		var gotValue float64
		var gotTS time.Time
		err := env.storeDB.QueryRow(ctx, "SELECT value, ts FROM txlimit WHERE name = $1", name).Scan(&gotValue, &gotTS)
		switch {
		case missing && !d.OK && errors.Is(err, pgx.ErrNoRows):
			// A denial on a missing key may leave it missing: the same
			// state.
		case d.OK:
			require.NoError(t, err, "case %d", i)
			require.Equal(t, next.Value, gotValue, "case %d", i)
			require.Equal(t, next.TS, gotTS.UnixMicro(), "case %d", i)
		default:
			require.NoError(t, err, "case %d", i)
			require.Equal(t, value, gotValue, "case %d: a denial writes nothing", i)
			require.Equal(t, ts.UnixMicro(), gotTS.UnixMicro(), "case %d", i)
		}
		now = now.Add(time.Duration(rng.IntN(4_000_000)-1_000_000) * time.Microsecond)
	}
}

// TestEscrowPruneAndReset: Prune deletes a full escrow row like any other,
// and a Reset detaches the calls pending on the key, so that a call that
// rolls back afterwards gives nothing to the fresh limit.
func TestEscrowPruneAndReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 3)
	clk := storetest.NewClock()
	name := storetest.UniqueName(t, "prune")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour, Escrow: true},
	}, clk.Now)

	tx, err := env.callers.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	res, err := l.LimitTx(ctx, tx, name, "k", txlimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, l.Reset(ctx, name, "k"))
	require.True(t, escrowTx(t, env.callers, l, name, "k", true, txlimit.Count(2)).OK)
	require.NoError(t, tx.Rollback(ctx))
	_, err = l.Settle(ctx, 0)
	require.NoError(t, err)
	require.False(t, escrowTx(t, env.callers, l, name, "k", true).OK, "the rolled-back call was taken before the reset: nothing comes back")

	clk.Advance(time.Hour)
	p, err := l.Prune(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, p.Deleted)
	pending, claims := env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
	require.True(t, escrowTx(t, env.callers, l, name, "k", true, txlimit.Count(2)).OK)
}

// TestEscrowNotMigrated: without the escrow migration, Ping and an escrow
// call say what to do.
func TestEscrowNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 2)
	_, err := env.storeDB.Exec(ctx, "DROP TABLE txlimit_escrow")
	require.NoError(t, err)
	name := storetest.UniqueName(t, "nomig")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour, Escrow: true},
	}, nil)
	require.ErrorIs(t, l.Ping(ctx), txlimit.ErrNotMigrated)
	tx, err := env.callers.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = l.LimitTx(ctx, tx, name, "k")
	require.ErrorIs(t, err, txlimit.ErrNotMigrated)
}

// TestEscrowThroughPgBouncer runs the exact-count scenario through a real
// PgBouncer in transaction mode, for the callers and for the store's debits
// alike, in the exec modes that work there. PgBouncer has more server
// connections than callers: a caller holds one for its whole transaction,
// and its debit needs another (docs/escrow.md).
func TestEscrowThroughPgBouncer(t *testing.T) {
	t.Parallel()
	testdb.NeedPgBouncer(t)
	db, direct := testdb.Database(t, "txlimit_escrow_pgbouncer")
	admin, err := pgxpool.New(context.Background(), direct)
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, migrations.Up(context.Background(), stdlib.OpenDBFromPool(admin), migrations.Postgres))
	const clients = 6
	url := testdb.PgBouncer(t, db, "transaction", clients+3)
	open := func(t *testing.T, mode pgx.QueryExecMode, conns int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = conns
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			storePool := open(t, mode, 2)
			env := escrowEnv{callers: open(t, mode, clients), store: pgstore.New(storePool, pgstore.EscrowSettleEvery(0)), storeDB: storePool}
			runEscrowConcurrentN(t, env, pgx.ReadCommitted, clients, 10, 30)
		})
	}
}

// TestEscrowLimitInOwnTransaction: Limit (not LimitTx) on an escrow limit
// takes the row in its own short transaction, so it needs one connection,
// not two: it works on a pool of one and leaves nothing to settle.
func TestEscrowLimitInOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeCacheStatement, 1)
	name := storetest.UniqueName(t, "own")
	l := escrowLimiter(t, pgstore.New(pool), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 3, Period: time.Hour, Escrow: true},
	}, func() time.Time { return storetest.T0 })
	for range 3 {
		res, err := l.Limit(ctx, name, "k")
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	res, err := l.Limit(ctx, name, "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	var pending int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM txlimit_escrow").Scan(&pending))
	require.Zero(t, pending)
}

// TestEscrowSettlesInBackground: with background settlement on (every 200
// ms here; a second by default), the escrow calls themselves settle every
// key: a rolled-back call's token comes back to a key nobody calls again,
// and the tables empty, with no Settle of the test's and no denial.
func TestEscrowSettlesInBackground(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	storePool := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 4)
	callers := testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 2)
	name := storetest.UniqueName(t, "background")
	l := escrowLimiter(t, pgstore.New(storePool, pgstore.EscrowSettleEvery(200*time.Millisecond)), map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 1000, Period: time.Hour, Escrow: true},
	}, func() time.Time { return storetest.T0 })
	require.True(t, escrowTx(t, callers, l, name, "quiet", false).OK, "granted, then rolled back")
	start := time.Now()
	back := false
	for i := 0; time.Since(start) < 30*time.Second; i++ {
		// Calls on another key, committed: they start the settlements.
		require.True(t, escrowTx(t, callers, l, name, "busy", true).OK)
		snap, err := l.Value(ctx, name, "quiet")
		require.NoError(t, err)
		pending, claims := escrowEnv{storeDB: storePool}.escrowRows(t)
		if snap.Value == 1000 && pending <= 1 && claims <= 1 {
			back = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, back, "the rolled-back call's token came back and the tables emptied (but the last call) without Settle")
	t.Logf("token back and tables settled %v after the rollback", time.Since(start).Round(time.Millisecond))
	snap, err := l.Value(ctx, name, "busy")
	require.NoError(t, err)
	require.Less(t, snap.Value, 1000.0, "the busy key's committed calls stay spent")
}

// TestEscrowSettleIsBounded: keys called once never settle themselves;
// Settle does, at most Max calls per run, and empties the tables.
func TestEscrowSettleIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEscrowEnv(t, pgx.QueryExecModeCacheStatement, 2)
	name := storetest.UniqueName(t, "cold")
	l := escrowLimiter(t, env.store, map[string]txlimit.Config{
		name: {Kind: txlimit.TokenBucket, Rate: 5, Period: time.Hour, Escrow: true},
	}, func() time.Time { return storetest.T0 })
	for i := range 30 {
		require.True(t, escrowTx(t, env.callers, l, name, fmt.Sprint(i), i%3 != 0).OK)
	}
	pending, claims := env.escrowRows(t)
	require.Equal(t, 30, pending)
	require.Equal(t, 20, claims)
	s, err := l.Settle(ctx, 12)
	require.NoError(t, err)
	require.Equal(t, 12, s.Spent+s.Refunded)
	require.EqualValues(t, 18, s.Pending)
	s2, err := l.Settle(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 20, s.Spent+s2.Spent)
	require.Equal(t, 10, s.Refunded+s2.Refunded)
	require.Equal(t, 10.0, s.Tokens+s2.Tokens)
	require.Zero(t, s2.Pending)
	pending, claims = env.escrowRows(t)
	require.Zero(t, pending)
	require.Zero(t, claims)
	for i := range 30 {
		snap, err := l.Value(ctx, name, fmt.Sprint(i))
		require.NoError(t, err)
		require.Equal(t, map[bool]float64{true: 4, false: 5}[i%3 != 0], snap.Value, "key %d", i)
	}
	_, err = l.Settle(ctx, -1)
	require.ErrorIs(t, err, txlimit.ErrInvalid)
}
