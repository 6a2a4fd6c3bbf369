package pgproto

import (
	"context"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// The operations of idempotent takes on PostgreSQL (the statements of
// queries/postgres/idempotency.sql). A claim is INSERT … ON CONFLICT DO
// UPDATE … WHERE: it waits at the unique index for a concurrent first call
// of the key, inserts the row when that call rolled back, takes it over
// when it has expired or holds no result, and otherwise locks it, and a
// statement of its own then reads it (under READ COMMITTED, as that call
// committed it).

var _ engine.ClaimDialect[DB] = dialect{}

// InsertClaim implements engine.ClaimDialect: ClaimIdempotency.
func (dialect) InsertClaim(ctx context.Context, db DB, p driver.ClaimParams) (bool, bool, error) {
	n, err := queries.ClaimIdempotency(ctx, db, pgdb.ClaimIdempotencyParams{ID: p.ID, Request: p.Request,
		WindowUs: p.Window.Microseconds(), Now: p.Now})
	return n == 1, true, err
}

// ReadClaim implements engine.ClaimDialect: ReadIdempotency.
func (dialect) ReadClaim(ctx context.Context, db DB, id string) (driver.Claimed, error) {
	row, err := queries.ReadIdempotency(ctx, db, id)
	return driver.Claimed{Request: row.Request, Result: row.Result}, err
}

// PruneClaims is one batch of driver.Ops.PruneClaims in db.
func (Protocol) PruneClaims(ctx context.Context, db DB, p driver.PruneClaimsParams) (int, error) {
	n, err := queries.PruneIdempotency(ctx, db, pgdb.PruneIdempotencyParams{MaxRows: int32(p.Max), Now: p.Now})
	return int(n), err
}

// PingClaims runs ProbeIdempotency, which fails when the
// txlimit_idempotency table or one of its columns is missing.
func PingClaims(ctx context.Context, db pgdb.DBTX) error { return queries.ProbeIdempotency(ctx, db) }

func (o *Ops[TTx]) Claim(ctx context.Context, tx TTx, p driver.ClaimParams) (driver.Claimed, error) {
	res, err := engine.Claim[DB](ctx, dialect(o.Proto), o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

// Record is driver.Ops.Record: RecordIdempotency, or DropIdempotency.
func (o *Ops[TTx]) Record(ctx context.Context, tx TTx, p driver.RecordParams) error {
	if p.Result == "" {
		return o.Err(ctx, tx, queries.DropIdempotency(ctx, o.AsDB(tx), p.ID))
	}
	return o.Err(ctx, tx, queries.RecordIdempotency(ctx, o.AsDB(tx), pgdb.RecordIdempotencyParams{ID: p.ID, Result: pgtype.Text{String: p.Result, Valid: true}}))
}
