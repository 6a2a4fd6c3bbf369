package sqlitestore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	gen "github.com/txlimit/txlimit/sqlitestore/internal/db"
)

// The operations of idempotent takes on SQLite
// (queries/sqlite/idempotency.sql). A claim is a write, which takes the
// database's write lock: a repeat in another transaction waits for the
// first call's to end (busy_timeout), and then reads what it recorded.

var _ engine.ClaimDialect[*sql.Tx] = (*backend)(nil)

// Claim implements driver.Ops (engine.Claim).
func (s *backend) Claim(ctx context.Context, tx *sql.Tx, p driver.ClaimParams) (driver.Claimed, error) {
	return engine.Claim(ctx, s, tx, p)
}

// InsertClaim implements engine.ClaimDialect: ExpireIdempotency, which
// takes the write lock, then ClaimIdempotency, which counts the row it
// inserted.
func (s *backend) InsertClaim(ctx context.Context, tx *sql.Tx, p driver.ClaimParams) (bool, bool, error) {
	at := clock(p.Now)
	err := s.queries.ExpireIdempotency(ctx, s.on(tx), gen.ExpireIdempotencyParams{ID: p.ID, Now: at.UnixMicro()})
	if err != nil {
		return false, false, wrap(ctx, tx, "claim the idempotency key", err)
	}
	n, err := s.queries.ClaimIdempotency(ctx, s.on(tx), gen.ClaimIdempotencyParams{ID: p.ID, Request: p.Request,
		ExpiresAt: at.Add(p.Window).UnixMicro()})
	return n == 1, true, wrap(ctx, tx, "claim the idempotency key", err)
}

// ReadClaim implements engine.ClaimDialect: ReadIdempotency.
func (s *backend) ReadClaim(ctx context.Context, tx *sql.Tx, id string) (driver.Claimed, error) {
	row, err := s.queries.ReadIdempotency(ctx, s.on(tx), id)
	return driver.Claimed{Request: row.Request, Result: row.Result}, wrap(ctx, tx, "read the idempotency key", err)
}

// Record implements driver.Ops: RecordIdempotency, or DropIdempotency.
func (s *backend) Record(ctx context.Context, tx *sql.Tx, p driver.RecordParams) error {
	if p.Result == "" {
		return wrap(ctx, tx, "record the idempotency key", s.queries.DropIdempotency(ctx, s.on(tx), p.ID))
	}
	err := s.queries.RecordIdempotency(ctx, s.on(tx), gen.RecordIdempotencyParams{ID: p.ID, Result: sql.NullString{String: p.Result, Valid: true}})
	return wrap(ctx, tx, "record the idempotency key", err)
}

// PruneClaims implements driver.Ops: one batch under the write lock, like
// any writer.
func (s *backend) PruneClaims(ctx context.Context, p driver.PruneClaimsParams) (n int, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) error {
		deleted, err := s.queries.PruneIdempotency(ctx, s.on(tx), gen.PruneIdempotencyParams{Now: clock(p.Now).UnixMicro(), MaxRows: int64(p.Max)})
		n = int(deleted)
		return wrap(ctx, tx, "prune idempotency keys", err)
	})
	return n, err
}

// PingClaims implements driver.Ops.
func (s *backend) PingClaims(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	return wrap(ctx, s.db, "ping", s.queries.ProbeIdempotency(ctx, s.db))
}
