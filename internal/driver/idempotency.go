package driver

import "time"

// Idempotent takes (txlimit.Idempotent) keep one row per idempotency key in
// a table of their own, txlimit_idempotency: the request the key was first
// used for, that call's result (none until it records one) and the instant
// the row expires. A call claims its key's row (Ops.Claim) before it takes,
// in the take's transaction, and records its result (Ops.Record) before
// that transaction ends: a repeat in another transaction waits for it at
// the claim and then reads what it recorded, or claims the key itself when
// it rolled back. A row that has expired, or holds no result, is the key
// unused.

// ClaimParams is the claim of one idempotency key.
type ClaimParams struct {
	ID string
	// Request describes the call, for a repeat to compare.
	Request string
	// Window is how long the row lasts after the clock.
	Window time.Duration
	Now    *time.Time
}

// Claimed is what a claim found.
type Claimed struct {
	// Fresh reports that the key is the call's own now: it was unused (no
	// row, an expired one, one without a result), and the call holds its
	// row until its transaction ends. Otherwise Request and Result are the
	// first call's.
	Fresh   bool
	Request string
	Result  string
}

// RecordParams is the end of a claim: the result of the call that claimed
// ID, or, when Result is "", nothing (the call took nothing: the row is
// deleted and the key unused again).
type RecordParams struct {
	ID     string
	Result string
}

// PruneClaimsParams is one batch of the idempotency keys' Prune.
type PruneClaimsParams struct {
	Max int
	Now *time.Time
}
