package pgsqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/pgproto"
)

// PruneClaims implements driver.Ops: one batch in a short transaction of
// its own, which passes over the rows live traffic holds (SKIP LOCKED).
func (s *backend) PruneClaims(ctx context.Context, p driver.PruneClaimsParams) (n int, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		n, err = s.Proto.PruneClaims(ctx, sqlTx{tx}, p)
		return s.mapErr(ctx, tx, err)
	})
	return n, err
}

// PingClaims implements driver.Ops.
func (s *backend) PingClaims(ctx context.Context) error {
	if s.DB == nil {
		return driver.ErrNoPool
	}
	return s.mapErr(ctx, s.DB, pgproto.PingClaims(ctx, sqlTx{s.DB}))
}
