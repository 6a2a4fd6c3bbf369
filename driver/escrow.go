package driver

import "context"

// Escrower is what a store adds to Store for limits in escrow mode
// (txlimit.Config.Escrow, docs/escrow.md). A store that lacks it, or whose
// EscrowReady returns an error, cannot hold escrow limits: txlimit.New
// rejects them.
type Escrower[TTx any] interface {
	// EscrowReady returns nil when the store can take escrow calls, and
	// otherwise why not, phrased as the fix (for example: the store has no
	// pool for the debit).
	EscrowReady() error

	// EscrowTake takes p.Count tokens from p's limit (one shard) in escrow:
	// a claim in tx and the debit in a short transaction of the store's own
	// that commits at once (a call that would be denied first settles the
	// ended calls of its key that may owe it tokens). The tokens stay taken
	// if and only if tx commits with the claim; otherwise settlement gives
	// them back. TakeResult.States holds the row after the call, and
	// TakeResult.Escrow identifies a granted call for EscrowCancel.
	EscrowTake(ctx context.Context, tx TTx, p TakeParams) (TakeResult, error)

	// EscrowCancel undoes the granted escrow call escrow (TakeResult.Escrow)
	// in tx, as if tx had rolled back to a savepoint taken before it: its
	// tokens go back to the limit at settlement. LimitAllTx cancels the
	// escrow calls it took when another of its limits denies.
	EscrowCancel(ctx context.Context, tx TTx, escrow int64) error

	// EscrowPing checks, on the store's pool, that the escrow tables are
	// there (ErrNotMigrated when not).
	EscrowPing(ctx context.Context) error

	// EscrowDelete detaches the pending calls of (Name, Key) in tx, for a
	// reset: their tokens no longer go back to the limit.
	EscrowDelete(ctx context.Context, tx TTx, p KeyParams) error

	// Settle settles up to p.Max ended calls of every key, in short
	// transactions of the store's own, and deletes claims left without a
	// call.
	Settle(ctx context.Context, p SettleParams) (SettleResult, error)
}

// SettleParams is one Settle.
type SettleParams struct {
	// Max is the most pending calls one Settle examines.
	Max int
}

// SettleResult is what one Settle did.
type SettleResult struct {
	Spent    int     // calls whose transaction committed: deleted
	Refunded int     // calls whose transaction did not: counts given back
	Tokens   float64 // the tokens given back
	Dropped  int     // refunds to a row that is gone (full): deleted
	Orphans  int     // claims without a call, deleted
	Pending  int64   // calls still pending afterwards (in progress or skipped)
}
