package driver

import "context"

// Escrower is what a store adds to Store for limits in escrow mode
// (txlimit.Config.Escrow, docs/escrow.md), beside taking, resetting and
// pinging them through Store's own methods (TakeParams.Escrow,
// ResetParams.Escrow, PingParams.Escrow). A store that lacks it, or whose
// EscrowReady returns an error, cannot hold escrow limits: txlimit.New
// rejects them.
type Escrower interface {
	// EscrowReady returns nil when the store can take escrow calls, and
	// otherwise why not, phrased as the fix (for example: the store has no
	// pool for the debit).
	EscrowReady() error

	// Settle settles up to p.Max ended calls of every key, in short
	// transactions of the store's own, and deletes claims left without a
	// call.
	Settle(ctx context.Context, p SettleParams) (SettleResult, error)
}

// DefaultSettleMax is the number of pending calls one Settle examines when
// Limiter.Settle is given 0, and what a store's background settlement
// examines.
const DefaultSettleMax = 10000

// SettleParams is one Settle.
type SettleParams struct {
	// Max is the most pending calls one Settle examines.
	Max int
}

// SettleResult reports what Settle did (driver.SettleResult).
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
