package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgdb"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// Escrow mode (docs/escrow.md): a call inserts a claim in the caller's
// transaction, and debits the limit in a transaction of its own on the
// store's pool that commits at once, so the limit's row is held only for
// that one statement. Settlement later looks at how the caller's
// transaction ended and gives the tokens back unless it committed the
// claim.

var _ driver.Escrower = (*Store)(nil)

const (
	// keySettleBatch is the most ended calls of its own key that a call
	// looks at when it would be denied (step one of settlement).
	keySettleBatch = 16
	// settleBatch is the most calls one statement of Settle examines.
	settleBatch = 500
)

// The debit and the settlement each run as one short transaction sent in a
// single round trip: READ COMMITTED whatever the pool's default (the debit
// locks the row it updates, and a stricter level would fail where READ
// COMMITTED waits), and synchronous_commit off. That is safe: WAL is
// flushed in order, so when the caller's commit is durable the debit that
// came before it is too, and a debit lost in a crash belongs to a caller
// that never committed; losing it returns its tokens.
const (
	beginEscrow     = "BEGIN ISOLATION LEVEL READ COMMITTED"
	asyncCommit     = "SET LOCAL synchronous_commit TO off"
	commitEscrow    = "COMMIT"
	escrowPoolError = "has no pool: an escrow limit debits on the store's pool, outside the caller's transaction; " +
		"pass a pool to pgstore.New (one with connections to spare beyond those the callers' transactions hold), " +
		"or leave Escrow off"
)

// EscrowReady implements driver.Escrower.
func (s *Store) EscrowReady() error {
	if s.pool == nil {
		return errors.New(escrowPoolError)
	}
	return nil
}

// escrowTake takes p's tokens in escrow: a claim in tx and the debit in a
// short transaction of the store's own that commits at once (a call that
// would be denied first settles the ended calls of its key that may owe it
// tokens). The tokens stay taken if and only if tx commits with the claim;
// otherwise settlement gives them back. claim identifies a granted call for
// unclaim.
func (s *Store) escrowTake(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (res driver.TakeResult, claim int64, err error) {
	s.settleInBackground()
	if s.pool == nil {
		return driver.TakeResult{}, 0, errors.New("txlimit/pgstore: the store " + escrowPoolError)
	}
	if p.Shards != 1 {
		return driver.TakeResult{}, 0, fmt.Errorf("txlimit/pgstore: an escrow limit has one shard, got %d", p.Shards)
	}
	c, err := queries.EscrowClaim(ctx, tx)
	if err != nil {
		return driver.TakeResult{}, 0, err
	}
	lt := pgproto.LockTimer{On: p.TimeLocks}
	res, err = s.escrowDebit(ctx, p, c, &lt)
	if err != nil {
		// Whether the debit committed is unknown: the claim stays, so
		// that if tx commits anyway the tokens count as spent (never
		// over-admit). The caller should roll back on an error.
		return driver.TakeResult{}, 0, err
	}
	res.LockWait = lt.Total
	if res.Decision.OK {
		return res, c.ID, nil
	}
	// Nothing was taken: the claim goes, so that the call leaves no row
	// behind.
	return res, 0, s.unclaim(ctx, tx, c.ID)
}

// unclaim undoes the escrow call of claim in tx, as if tx had rolled back
// to a savepoint taken before it: its tokens go back to the limit at
// settlement.
func (s *Store) unclaim(ctx context.Context, tx pgx.Tx, claim int64) error {
	return queries.EscrowUnclaim(ctx, tx, claim)
}

// settleInBackground starts a settlement in a goroutine of its own when the
// last one started at least settleEvery ago and none is running
// (EscrowSettleEvery).
func (s *Store) settleInBackground() {
	if s.settleEvery <= 0 || s.pool == nil {
		return
	}
	now := time.Now().UnixNano()
	if now-s.lastSettle.Load() < int64(s.settleEvery) || !s.settling.CompareAndSwap(false, true) {
		return
	}
	s.lastSettle.Store(now)
	go func() {
		defer s.settling.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), max(10*s.settleEvery, 30*time.Second))
		defer cancel()
		_, _ = s.settle(ctx, driver.SettleParams{Max: driver.DefaultSettleMax})
	}()
}

// escrowDebit takes p's tokens for claim on the store's pool. A call that
// is not a reservation runs the lean statement of its kind, which grants in
// one round trip. When it grants nothing, the row as last committed and the
// key's ended calls are read in one more round trip, and algo decides: a
// denial stands unless ended calls of the key may owe it tokens, which are
// then settled first, so that a rolled-back call's tokens are there for the
// next call of its key that needs them. EscrowDebit, which serves any call,
// then decides again (a reservation goes to it at once).
func (s *Store) escrowDebit(ctx context.Context, p driver.TakeParams, claim pgdb.EscrowClaimRow, lt *pgproto.LockTimer) (driver.TakeResult, error) {
	retried := false
	if !p.Reserve {
		start := lt.Start()
		next, clock, ok, err := s.leanDebit(ctx, p, claim)
		lt.Stop(start)
		if err != nil {
			return driver.TakeResult{}, err
		}
		if ok {
			return driver.TakeResult{Decision: driver.Granted(p.Config, next, clock.UnixMicro()), At: clock, States: []algo.State{next}}, nil
		}
		row, fates, err := s.readKey(ctx, p)
		if err != nil {
			return driver.TakeResult{}, err
		}
		old := p.Full()
		if row.Value != nil && row.Ts != nil {
			old = algo.State{Value: *row.Value, TS: row.Ts.UnixMicro()}
		}
		next, d := algo.Take(p.Shard(1), old, row.Clock.UnixMicro(), p.Count, false)
		if !d.OK {
			if refunded, err := s.refund(ctx, fates); err != nil || !refunded {
				return driver.TakeResult{Decision: d, At: row.Clock, States: []algo.State{next}}, err
			}
			retried = true
		}
		// algo grants on the row as it is now (a refund or a concurrent
		// credit came in since), or refunds did: EscrowDebit decides.
	}
	for {
		start := lt.Start()
		deb, err := s.debit(ctx, p, claim)
		lt.Stop(start)
		if err != nil {
			return driver.TakeResult{}, err
		}
		old := algo.State{Value: deb.Value, TS: deb.Ts.UnixMicro()}
		next, d := algo.Take(p.Shard(1), old, deb.Clock.UnixMicro(), p.Count, p.Reserve)
		if d.OK != deb.Ok {
			return driver.TakeResult{}, fmt.Errorf("txlimit/pgstore: internal error: the escrow debit decided OK=%v where algo decides OK=%v "+
				"(row %v at %v, count %v, now %v); roll back and report this", deb.Ok, d.OK, deb.Value, deb.Ts, p.Count, deb.Clock)
		}
		res := driver.TakeResult{Decision: d, At: deb.Clock, States: []algo.State{next}}
		if d.OK || retried {
			return res, nil
		}
		retried = true
		fates, err := queries.EscrowKeyFates(ctx, s.pool, pgdb.EscrowKeyFatesParams{Name: p.Name, Key: p.Key, MaxEntries: keySettleBatch})
		if err != nil {
			return driver.TakeResult{}, err
		}
		if refunded, err := s.refund(ctx, fates); err != nil || !refunded {
			return res, err
		}
	}
}

// leanDebit runs EscrowDebitBucket or EscrowDebitWindow, as a transaction
// of its own in one round trip: alone while the pool's transactions are READ
// COMMITTED (the statement then makes its commit asynchronous itself), else
// wrapped in BEGIN ISOLATION LEVEL READ COMMITTED … COMMIT (see escrowTx).
// ok is false when it granted nothing.
func (s *Store) leanDebit(ctx context.Context, p driver.TakeParams, claim pgdb.EscrowClaimRow) (algo.State, time.Time, bool, error) {
	cfg, full := p.Config, p.Full()
	fresh, ok := driver.Fresh(p)
	var value float64
	var ts, clock time.Time
	send := func(q pgdb.DBTX) error {
		if cfg.Kind == algo.FixedWindow {
			r, err := queries.EscrowDebitWindow(ctx, q, pgdb.EscrowDebitWindowParams{
				Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FreshOk: ok, FullTs: time.UnixMicro(full.TS), Now: p.Now,
				Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
				Claim: claim.ID, Xid: claim.Xid,
			})
			value, ts, clock = r.Value, r.Ts, r.Clock
			return err
		}
		r, err := queries.EscrowDebitBucket(ctx, q, pgdb.EscrowDebitBucketParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FreshOk: ok, FullTs: time.UnixMicro(full.TS), Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
			Claim: claim.ID, Xid: claim.Xid,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
		return err
	}
	var err error
	if s.escrowTx.Load() {
		err = s.inEscrowTx(ctx, send)
	} else {
		err = send(s.pool)
	}
	return pgproto.TakenRow(value, ts, clock, err)
}

// readKey reads the key's row as last committed, with the clock, and step
// one of the key's settlement, in one round trip.
func (s *Store) readKey(ctx context.Context, p driver.TakeParams) (row pgdb.EscrowReadRow, fates []pgdb.EscrowKeyFatesRow, err error) {
	err = pgproto.Send(ctx, s.pool, func(q pgdb.DBTX) (err error) {
		row, err = queries.EscrowRead(ctx, q, pgdb.EscrowReadParams{Name: p.Name, Key: p.Key, Now: p.Now})
		return err
	}, func(q pgdb.DBTX) (err error) {
		fates, err = queries.EscrowKeyFates(ctx, q, pgdb.EscrowKeyFatesParams{Name: p.Name, Key: p.Key, MaxEntries: keySettleBatch})
		return err
	})
	if err == nil && row.Isolation != "read committed" {
		// The lean debits grant only at READ COMMITTED: from now on they
		// are sent inside a transaction that sets it.
		s.escrowTx.Store(true)
	}
	return row, fates, err
}

// refund settles the ended calls of fates when one of them may owe its
// tokens back, and reports whether tokens came back.
func (s *Store) refund(ctx context.Context, fates []pgdb.EscrowKeyFatesRow) (bool, error) {
	maybe := false
	for _, f := range fates {
		maybe = maybe || f.MaybeRefund
	}
	if !maybe {
		return false, nil
	}
	claims := make([]int64, len(fates))
	for i, f := range fates {
		claims[i] = f.Claim
	}
	n, err := s.settleClaims(ctx, claims)
	return n.Refunded > 0, err
}

// debit runs EscrowDebit in a transaction of its own, creating the key's
// row first when it has none.
func (s *Store) debit(ctx context.Context, p driver.TakeParams, claim pgdb.EscrowClaimRow) (pgdb.EscrowDebitRow, error) {
	params := pgdb.EscrowDebitParams{
		Name: p.Name, Key: p.Key, Now: p.Now,
		Kind: int32(p.Config.Kind), Period: p.Config.Period, Capacity: p.Config.Capacity,
		Rate: p.Config.Rate, Count: p.Count, Reserve: p.Reserve, MaxReserved: p.Config.MaxReserved,
		Claim: claim.ID, Xid: claim.Xid,
	}
	for range 2 {
		var row pgdb.EscrowDebitRow
		err := s.inEscrowTx(ctx, func(q pgdb.DBTX) (err error) {
			row, err = queries.EscrowDebit(ctx, q, params)
			return err
		})
		if !errors.Is(err, pgx.ErrNoRows) {
			return row, err
		}
		// At READ COMMITTED too: at a stricter default, a row another
		// call inserted meanwhile would fail this with 40001.
		full := p.Full()
		if err := s.inEscrowTx(ctx, func(q pgdb.DBTX) error {
			return queries.EscrowInsertRow(ctx, q, pgdb.EscrowInsertRowParams{
				Name: p.Name, Key: p.Key, Value: full.Value, Ts: time.UnixMicro(full.TS),
			})
		}); err != nil {
			return pgdb.EscrowDebitRow{}, err
		}
	}
	return pgdb.EscrowDebitRow{}, errors.New("txlimit/pgstore: the escrow limit's row vanished twice while being debited (reset or pruned meanwhile); try again")
}

// inEscrowTx sends, in one round trip on the store's pool, the short
// transaction of an escrow step: BEGIN, SET LOCAL synchronous_commit, the
// statement of c, and COMMIT. Every escrow statement that writes runs this
// way (but the lean debits, which check the level themselves): at READ
// COMMITTED whatever the pool's default, where a stricter level would fail
// with 40001 on rows other calls changed. An error of c (pgx.ErrNoRows
// included) is returned once the batch has been read to the end.
func (s *Store) inEscrowTx(ctx context.Context, c pgproto.Call) error {
	return pgproto.Send(ctx, s.pool, pgproto.Exec(ctx, beginEscrow), pgproto.Exec(ctx, asyncCommit), c, pgproto.Exec(ctx, commitEscrow))
}

// settleClaims runs step two of settlement on claims, which step one found
// ended, in a transaction of its own.
func (s *Store) settleClaims(ctx context.Context, claims []int64) (driver.SettleResult, error) {
	var out driver.SettleResult
	if len(claims) == 0 {
		return out, nil
	}
	err := s.inEscrowTx(ctx, func(q pgdb.DBTX) error {
		rows, err := queries.EscrowSettle(ctx, q, claims)
		for _, r := range rows {
			switch {
			case r.Spent:
				out.Spent++
			case r.Refund:
				out.Refunded++
				out.Tokens += r.Count
			default:
				out.Dropped++
			}
		}
		return err
	})
	if err != nil {
		return driver.SettleResult{}, err
	}
	return out, nil
}

// Settle implements driver.Escrower: first the calls whose claim is
// visible (spent, in one statement per batch), then step one over every
// key, from the oldest call on, and step two on what it found, in batches,
// then the orphaned claims.
func (s *Store) Settle(ctx context.Context, p driver.SettleParams) (driver.SettleResult, error) {
	res, err := s.settle(ctx, p)
	return res, mapErr(err)
}

func (s *Store) settle(ctx context.Context, p driver.SettleParams) (driver.SettleResult, error) {
	var out driver.SettleResult
	if s.pool == nil {
		return out, driver.ErrNoPool
	}
	seen := 0
	for after := int64(0); seen < p.Max; {
		n := min(settleBatch, p.Max-seen)
		var spent []int64
		err := s.inEscrowTx(ctx, func(q pgdb.DBTX) (err error) {
			spent, err = queries.EscrowSettleSpent(ctx, q, pgdb.EscrowSettleSpentParams{After: after, MaxEntries: int32(n)})
			return err
		})
		if err != nil {
			return out, err
		}
		out.Spent += len(spent)
		seen += len(spent)
		if len(spent) < n {
			break
		}
		after = spent[len(spent)-1]
	}
	var after int64
	for seen < p.Max {
		fates, err := queries.EscrowFates(ctx, s.pool, pgdb.EscrowFatesParams{After: after, MaxEntries: int32(min(settleBatch, p.Max-seen))})
		if err != nil {
			return out, err
		}
		if len(fates) == 0 {
			break
		}
		claims := make([]int64, len(fates))
		for i, f := range fates {
			claims[i] = f.Claim
		}
		n, err := s.settleClaims(ctx, claims)
		if err != nil {
			return out, err
		}
		out.Spent += n.Spent
		out.Refunded += n.Refunded
		out.Tokens += n.Tokens
		out.Dropped += n.Dropped
		seen += len(fates)
		after = claims[len(claims)-1]
	}
	err := s.inEscrowTx(ctx, func(q pgdb.DBTX) error {
		n, err := queries.EscrowDeleteOrphanClaims(ctx, q, int32(min(settleBatch, max(p.Max, 1))))
		out.Orphans = int(n)
		return err
	})
	if err != nil {
		return out, err
	}
	count, err := queries.EscrowCount(ctx, s.pool)
	if err != nil {
		return out, err
	}
	out.Pending = count.Pending
	return out, nil
}
