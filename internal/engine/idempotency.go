package engine

import (
	"context"

	"github.com/txlimit/txlimit/internal/driver"
)

// ClaimDialect is the operations of one database on the rows of
// idempotency keys (the txlimit_idempotency table), for Claim.
type ClaimDialect[TTx any] interface {
	// InsertClaim inserts p's row, or takes over the row of p.ID when it
	// has expired at the clock or holds no result, waiting for the
	// transaction that holds it, and holds the row either way until tx
	// ends. claimed reports that it inserted or took over the row, when
	// known: a database that cannot tell leaves it to ReadClaim.
	InsertClaim(ctx context.Context, tx TTx, p driver.ClaimParams) (claimed, known bool, err error)

	// ReadClaim reads the request and the result ("" for none) of the row
	// of id, which tx holds, as last committed.
	ReadClaim(ctx context.Context, tx TTx, id string) (driver.Claimed, error)
}

// Claim is driver.Ops.Claim on d: InsertClaim, then, unless that claimed
// the key, ReadClaim. A row tx holds that has no result is tx's own,
// whoever wrote it: InsertClaim took it over, or found it unchanged.
func Claim[TTx any](ctx context.Context, d ClaimDialect[TTx], tx TTx, p driver.ClaimParams) (driver.Claimed, error) {
	claimed, known, err := d.InsertClaim(ctx, tx, p)
	if err != nil || (known && claimed) {
		return driver.Claimed{Fresh: claimed}, err
	}
	c, err := d.ReadClaim(ctx, tx, p.ID)
	if err != nil {
		return driver.Claimed{}, err
	}
	c.Fresh = c.Result == ""
	return c, nil
}
