package txlimit

import (
	"context"
	"fmt"

	"github.com/txlimit/txlimit/driver"
)

// escrowSupport is the Limiter's view of its store's escrow mode.
type escrowSupport[TTx any] struct {
	store driver.Escrower[TTx] // nil when the store has no escrow mode
}

func newEscrowSupport[TTx any](store Store[TTx]) escrowSupport[TTx] {
	e, _ := any(store).(driver.Escrower[TTx])
	return escrowSupport[TTx]{store: e}
}

// check rejects an Escrow config that the store cannot serve.
func (e escrowSupport[TTx]) check(name string, c Config) error {
	if !c.Escrow {
		return nil
	}
	if e.store == nil {
		return &InvalidError{Limit: name, Field: "Escrow", Problem: "is not supported by this store: escrow mode " +
			"needs PostgreSQL through pgstore; leave Escrow off (and give a hot limit Shards instead)"}
	}
	if err := e.store.EscrowReady(); err != nil {
		return &InvalidError{Limit: name, Field: "Escrow", Problem: "needs a store that can debit outside the caller's transaction, but the store " + err.Error()}
	}
	return nil
}

// reset detaches the pending calls of an escrow limit's key, in tx.
func (e escrowSupport[TTx]) reset(ctx context.Context, tx TTx, c Config, r request) error {
	if !c.Escrow || e.store == nil {
		return nil
	}
	return e.store.EscrowDelete(ctx, tx, driver.KeyParams{Name: r.name, Key: r.key})
}

// ping checks the escrow tables when one of limits is in escrow mode.
func (e escrowSupport[TTx]) ping(ctx context.Context, limits map[string]Config) error {
	if e.store == nil {
		return nil
	}
	for _, c := range limits {
		if c.Escrow {
			return e.store.EscrowPing(ctx)
		}
	}
	return nil
}

// DefaultSettleMax is the number of pending calls one Settle examines when
// SettleOptions.Max is 0.
const DefaultSettleMax = 10000

// SettleOptions configures Settle. A nil *SettleOptions is the zero value,
// which is ready to use.
type SettleOptions struct {
	// Max bounds the work of one call: the number of pending escrow calls
	// it examines (in statements of at most 500). Defaults to
	// DefaultSettleMax.
	Max int
}

// SettleResult reports what Settle did.
type SettleResult struct {
	// Spent is the number of calls whose transaction committed: their
	// tokens stay taken, and their rows were deleted.
	Spent int
	// Refunded is the number of calls whose transaction rolled back (or
	// rolled back to a savepoint around the call, or died): their tokens,
	// Tokens in all, went back to their limits.
	Refunded int
	Tokens   float64
	// Dropped is the number of refunds to a limit whose state is gone
	// (reset, or pruned as full): a missing row is full, so there was
	// nothing to give back.
	Dropped int
	// Orphans is the number of claims deleted that had no call: those of a
	// call that failed (or was reset) in a transaction that committed.
	Orphans int
	// Pending is the number of escrow calls still pending when Settle
	// ended: those whose transaction is still open, those another
	// settler or a lock held, and those past Max.
	Pending int64
}

// Settle settles the calls that escrow limits (Config.Escrow) took in
// transactions that have ended since: the tokens of a committed call stay
// taken, those of a call that did not commit go back to its limit, and the
// rows that recorded them are deleted. An escrow call settles nothing itself
// but, when it would be denied, the ended calls of its own key that may owe
// it tokens; pgstore settles the rest in the background about once a second
// while escrow calls are made (pgstore.EscrowSettleEvery). Settle is what
// settles the calls left when the calls stop, and bounds the escrow tables
// (two rows per call until it is settled) when the background is off. Run
// it every few seconds, from one process or from many (settlers skip each
// other's rows and never wait for a lock), for example in a goroutine:
//
//	go func() {
//		for range time.Tick(5 * time.Second) {
//			if _, err := limiter.Settle(ctx, nil); err != nil { log.Print(err) }
//		}
//	}()
//
// or as a periodic job of the application's scheduler (River's
// PeriodicJob). Settle needs no configuration of the limits: any Limiter on
// the database settles every escrow limit in it. It runs short transactions
// of its own on the store's pool (ErrNoPool without one) and returns
// ErrInvalid for a store without escrow mode.
func (l *Limiter[TTx]) Settle(ctx context.Context, opts *SettleOptions) (SettleResult, error) {
	var o SettleOptions
	if opts != nil {
		o = *opts
	}
	if o.Max < 0 {
		return SettleResult{}, &InvalidError{Field: "SettleOptions.Max", Problem: fmt.Sprintf("must be >= 0 (0 means %d), got %d", DefaultSettleMax, o.Max)}
	}
	if o.Max == 0 {
		o.Max = DefaultSettleMax
	}
	if l.escrow.store == nil {
		return SettleResult{}, &InvalidError{Field: "store", Problem: "has no escrow mode, so there is nothing to settle: only pgstore has one"}
	}
	r, err := l.escrow.store.Settle(ctx, driver.SettleParams{Max: o.Max})
	return SettleResult{
		Spent: r.Spent, Refunded: r.Refunded, Tokens: r.Tokens, Dropped: r.Dropped, Orphans: r.Orphans, Pending: r.Pending,
	}, err
}
