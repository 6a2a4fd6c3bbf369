package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// PruneClaims implements driver.Ops: one batch in a short transaction of
// its own, which passes over the rows live traffic holds (SKIP LOCKED).
func (s *backend) PruneClaims(ctx context.Context, p driver.PruneClaimsParams) (n int, err error) {
	err = s.InTx(ctx, false, func(tx pgx.Tx) (err error) {
		n, err = s.Proto.PruneClaims(ctx, tx, p)
		return err
	})
	return n, mapErr(err)
}

// PingClaims implements driver.Ops.
func (s *backend) PingClaims(ctx context.Context) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	return mapErr(pgproto.PingClaims(ctx, s.pool))
}
