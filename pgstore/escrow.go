package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
	"github.com/txlimit/txlimit/pgstore/internal/db"
)

// Escrow mode (docs/escrow.md): a call inserts a claim in the caller's
// transaction, and debits the limit in a transaction of its own on the
// store's pool that commits at once, so the limit's row is held only for
// that one statement. Settlement later looks at how the caller's
// transaction ended and gives the tokens back unless it committed the
// claim.

var _ driver.Escrower[pgx.Tx] = (*Store)(nil)

const (
	// keySettleBatch is the most ended calls of its own key that one
	// escrow call looks at after its debit (step one of settlement).
	keySettleBatch = 16
	// keySettleAt is how many ended calls a key must have before an
	// escrow call settles them (step two) when none of them may need a
	// refund: spent calls only take room, so they are settled in
	// batches, while a possible refund is settled at once.
	keySettleAt = 8
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

// EscrowPing checks that the escrow tables are there, on the store's pool.
func (s *Store) EscrowPing(ctx context.Context) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	return mapErr(s.queries.ProbeEscrow(ctx, s.pool))
}

// EscrowTake implements driver.Escrower.
func (s *Store) EscrowTake(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	res, err := s.escrowTake(ctx, tx, p)
	return res, mapErr(err)
}

func (s *Store) escrowTake(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	if s.pool == nil {
		return driver.TakeResult{}, errors.New("txlimit/pgstore: the store " + escrowPoolError)
	}
	if p.Shards != 1 {
		return driver.TakeResult{}, fmt.Errorf("txlimit/pgstore: an escrow limit has one shard, got %d", p.Shards)
	}
	claim, err := s.queries.EscrowClaim(ctx, tx)
	if err != nil {
		return driver.TakeResult{}, err
	}
	lt := pgproto.LockTimer{On: p.TimeLocks}
	start := lt.Start()
	deb, fates, err := s.debit(ctx, p, claim)
	lt.Stop(start)
	if err != nil {
		// Whether the debit committed is unknown: the claim stays, so
		// that if tx commits anyway the tokens count as spent (never
		// over-admit). The caller should roll back on an error.
		return driver.TakeResult{}, err
	}
	if !deb.Ok && needsRefund(fates) {
		// The key may owe tokens to calls that rolled back: settle them
		// now and try once more, so that a rolled-back call's tokens are
		// there for the next call of its key.
		if n, _ := s.settleClaims(ctx, claimsOf(fates)); n.Refunded > 0 {
			start := lt.Start()
			deb, fates, err = s.debit(ctx, p, claim)
			lt.Stop(start)
			if err != nil {
				return driver.TakeResult{}, err
			}
		}
	}
	if (needsRefund(fates) || len(fates) >= keySettleAt) && s.settlingKey(p.Name, p.Key) {
		// Best effort: an error here (a cancelled ctx, a lost connection)
		// leaves the calls for a later call or for Settle, and the take
		// itself has succeeded.
		_, _ = s.settleClaims(ctx, claimsOf(fates))
		s.keySettled(p.Name, p.Key)
	}
	old := algo.State{Value: deb.Value, TS: deb.Ts.UnixMicro()}
	next, d := algo.Take(p.Shard(1), old, deb.Clock.UnixMicro(), p.Count, p.Reserve)
	if d.OK != deb.Ok {
		return driver.TakeResult{}, fmt.Errorf("txlimit/pgstore: internal error: the escrow debit decided OK=%v where algo decides OK=%v "+
			"(row %v at %v, count %v, now %v); roll back and report this", deb.Ok, d.OK, deb.Value, deb.Ts, p.Count, deb.Clock)
	}
	if !d.OK {
		// Nothing was taken: the claim goes, so that the call leaves no
		// row behind.
		if err := s.queries.EscrowUnclaim(ctx, tx, claim.ID); err != nil {
			return driver.TakeResult{}, err
		}
	}
	return driver.TakeResult{Decision: d, At: deb.Clock, States: []algo.State{next}, LockWait: lt.Total}, nil
}

// debit runs EscrowDebit in a transaction of its own, creating the key's
// row first when it has none, and then step one of the key's settlement,
// in the same round trip.
func (s *Store) debit(ctx context.Context, p driver.TakeParams, claim db.EscrowClaimRow) (db.EscrowDebitRow, []db.EscrowKeyFatesRow, error) {
	params := db.EscrowDebitParams{
		Name: p.Name, Key: p.Key, Now: p.Now,
		PeriodUs: p.Config.Period, Capacity: p.Config.Capacity, FixedWindow: p.Config.Kind == algo.FixedWindow,
		Rate: p.Config.Rate, Count: p.Count, Reserve: p.Reserve, MaxReserved: p.Config.MaxReserved,
		Claim: claim.ID, Xid: claim.Xid,
	}
	for range 2 {
		row, fates, err := s.sendDebit(ctx, params)
		if !errors.Is(err, pgx.ErrNoRows) {
			return row, fates, err
		}
		full := p.Full()
		if err := s.queries.EscrowInsertRow(ctx, s.pool, db.EscrowInsertRowParams{
			Name: p.Name, Key: p.Key, Value: full.Value, Ts: time.UnixMicro(full.TS),
		}); err != nil {
			return db.EscrowDebitRow{}, nil, err
		}
	}
	return db.EscrowDebitRow{}, nil, errors.New("txlimit/pgstore: the escrow limit's row vanished twice while being debited (reset or pruned meanwhile); try again")
}

// sendDebit sends the debit's transaction and the key's step one of
// settlement (after the debit has committed) in one batch. The debit's
// result is pgx.ErrNoRows when the key has no row.
func (s *Store) sendDebit(ctx context.Context, params db.EscrowDebitParams) (db.EscrowDebitRow, []db.EscrowKeyFatesRow, error) {
	b := &pgx.Batch{}
	b.Queue(beginEscrow)
	b.Queue(asyncCommit)
	if _, err := s.queries.EscrowDebit(ctx, queuer{b}, params); queued(err) != nil {
		return db.EscrowDebitRow{}, nil, queued(err)
	}
	b.Queue(commitEscrow)
	if _, err := s.queries.EscrowKeyFates(ctx, queuer{b}, db.EscrowKeyFatesParams{
		Name: params.Name, Key: params.Key, MaxEntries: keySettleBatch,
	}); queued(err) != nil {
		return db.EscrowDebitRow{}, nil, queued(err)
	}
	res := s.pool.SendBatch(ctx, b)
	var row db.EscrowDebitRow
	var fates []db.EscrowKeyFatesRow
	_, err := res.Exec()
	if err == nil {
		_, err = res.Exec()
	}
	var debitErr error
	if err == nil {
		debitErr = res.QueryRow().Scan(&row.Value, &row.Ts, &row.Clock, &row.Ok)
		if !errors.Is(debitErr, pgx.ErrNoRows) {
			err = debitErr
		}
	}
	if err == nil {
		_, err = res.Exec()
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var f db.EscrowKeyFatesRow
			_, err = pgx.ForEachRow(rows, []any{&f.Claim, &f.MaybeRefund}, func() error {
				fates = append(fates, f)
				return nil
			})
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return db.EscrowDebitRow{}, nil, err
	}
	return row, fates, debitErr
}

// settlingKey reports whether the caller may settle the ended calls of
// (name, key) after its debit: not while another call of the same key on
// this store is doing so. On a hot key every call finds the same ended
// calls; settling them once is enough, and the calls that skip it spare
// the database a statement that would find the rows settled or locked
// (SKIP LOCKED). A call that would be denied does not ask: it settles its
// key's possible refunds whatever the others do. keySettled ends the turn.
func (s *Store) settlingKey(name, key string) bool {
	_, busy := s.keySettling.LoadOrStore(escrowKey{name, key}, struct{}{})
	return !busy
}

func (s *Store) keySettled(name, key string) { s.keySettling.Delete(escrowKey{name, key}) }

type escrowKey struct{ name, key string }

func needsRefund(fates []db.EscrowKeyFatesRow) bool {
	for _, f := range fates {
		if f.MaybeRefund {
			return true
		}
	}
	return false
}

func claimsOf(fates []db.EscrowKeyFatesRow) []int64 {
	out := make([]int64, len(fates))
	for i, f := range fates {
		out[i] = f.Claim
	}
	return out
}

// settleClaims runs step two of settlement on claims, which step one found
// ended, in a transaction of its own.
func (s *Store) settleClaims(ctx context.Context, claims []int64) (driver.SettleResult, error) {
	var out driver.SettleResult
	if len(claims) == 0 {
		return out, nil
	}
	b := &pgx.Batch{}
	b.Queue(beginEscrow)
	b.Queue(asyncCommit)
	if _, err := s.queries.EscrowSettle(ctx, queuer{b}, claims); queued(err) != nil {
		return out, queued(err)
	}
	b.Queue(commitEscrow)
	res := s.pool.SendBatch(ctx, b)
	_, err := res.Exec()
	if err == nil {
		_, err = res.Exec()
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = res.Query(); err == nil {
			var r db.EscrowSettleRow
			_, err = pgx.ForEachRow(rows, []any{&r.Claim, &r.Spent, &r.Refund, &r.Count}, func() error {
				switch {
				case r.Spent:
					out.Spent++
				case r.Refund:
					out.Refunded++
					out.Tokens += r.Count
				default:
					out.Dropped++
				}
				return nil
			})
		}
	}
	if err == nil {
		_, err = res.Exec()
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return driver.SettleResult{}, err
	}
	return out, nil
}

// EscrowDelete implements driver.Escrower.
func (s *Store) EscrowDelete(ctx context.Context, tx pgx.Tx, p driver.KeyParams) error {
	return mapErr(s.queries.EscrowDeleteKey(ctx, tx, db.EscrowDeleteKeyParams{Name: p.Name, Key: p.Key}))
}

// Settle implements driver.Escrower: step one over every key, from the
// oldest call on, then step two on what it found, in batches, then the
// orphaned claims.
func (s *Store) Settle(ctx context.Context, p driver.SettleParams) (driver.SettleResult, error) {
	res, err := s.settle(ctx, p)
	return res, mapErr(err)
}

func (s *Store) settle(ctx context.Context, p driver.SettleParams) (driver.SettleResult, error) {
	var out driver.SettleResult
	if s.pool == nil {
		return out, driver.ErrNoPool
	}
	var after int64
	for seen := 0; seen < p.Max; {
		fates, err := s.queries.EscrowFates(ctx, s.pool, db.EscrowFatesParams{After: after, MaxEntries: int32(min(settleBatch, p.Max-seen))})
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
	orphans, err := s.queries.EscrowDeleteOrphanClaims(ctx, s.pool, int32(min(settleBatch, max(p.Max, 1))))
	if err != nil {
		return out, err
	}
	out.Orphans = int(orphans)
	count, err := s.queries.EscrowCount(ctx, s.pool)
	if err != nil {
		return out, err
	}
	out.Pending = count.Pending
	return out, nil
}
