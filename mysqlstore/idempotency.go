package mysqlstore

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// The operations of idempotent takes on MySQL and MariaDB
// (rawsql/idempotency.sql). A claim inserts or locks the key's row with
// INSERT … ON DUPLICATE KEY UPDATE, which takes an exclusive lock on the
// row it finds: repeats waiting for a first call queue for that lock and
// never hold a shared one they would have to upgrade (the deadlock of
// INSERT IGNORE). What it did is read back with a locking read, which sees
// the latest committed row under REPEATABLE READ too: a row without a
// result is the call's.

var (
	claimSQL, claimReadSQL = rawsql.Get("ClaimIdempotency"), rawsql.Get("ClaimRead").SQL
	recordSQL, dropSQL     = rawsql.Get("RecordIdempotency"), rawsql.Get("DropIdempotency").SQL
	expiredClaimsSQL       = rawsql.Get("ExpiredIdempotency")
	probeClaimsSQL         = rawsql.Get("ProbeIdempotency").SQL
)

var _ engine.ClaimDialect[*sql.Tx] = claimDialect{}

// claimDialect is engine.ClaimDialect on MySQL.
type claimDialect struct{}

// nowArg is now as an argument of the statements: NULL for the server's
// clock.
func nowArg(now *time.Time) any {
	if now == nil {
		return nil
	}
	return now.UTC()
}

// Claim implements driver.Ops (engine.Claim).
func (s *backend) Claim(ctx context.Context, tx *sql.Tx, p driver.ClaimParams) (driver.Claimed, error) {
	return engine.Claim(ctx, claimDialect{}, tx, p)
}

// InsertClaim implements engine.ClaimDialect: ClaimIdempotency, whose
// count of rows leaves ReadClaim to tell (it depends on clientFoundRows).
func (claimDialect) InsertClaim(ctx context.Context, tx *sql.Tx, p driver.ClaimParams) (bool, bool, error) {
	_, err := tx.ExecContext(ctx, claimSQL.SQL, claimSQL.Args(map[string]any{
		"id": []byte(p.ID), "request": []byte(p.Request), "window": p.Window.Microseconds(), "now": nowArg(p.Now)})...)
	return false, false, wrap(ctx, tx, "claim the idempotency key", err)
}

// ReadClaim implements engine.ClaimDialect: ClaimRead.
func (claimDialect) ReadClaim(ctx context.Context, tx *sql.Tx, id string) (driver.Claimed, error) {
	var c driver.Claimed
	err := tx.QueryRowContext(ctx, claimReadSQL, []byte(id)).Scan(&c.Request, &c.Result)
	return c, wrap(ctx, tx, "read the idempotency key", err)
}

// Record implements driver.Ops: RecordIdempotency, or DropIdempotency.
func (s *backend) Record(ctx context.Context, tx *sql.Tx, p driver.RecordParams) error {
	var err error
	if p.Result == "" {
		_, err = tx.ExecContext(ctx, dropSQL, []byte(p.ID))
	} else {
		_, err = tx.ExecContext(ctx, recordSQL.SQL, recordSQL.Args(map[string]any{"id": []byte(p.ID), "result": []byte(p.Result)})...)
	}
	return wrap(ctx, tx, "record the idempotency key", err)
}

// PruneClaims implements driver.Ops: one batch in a READ COMMITTED
// transaction of its own, which locks the expired rows no other transaction
// holds (ExpiredIdempotency) and deletes them by their ids.
func (s *backend) PruneClaims(ctx context.Context, p driver.PruneClaimsParams) (int, error) {
	if s.db == nil {
		return 0, driver.ErrNoPool
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, s.BeginErr(ctx, err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, expiredClaimsSQL.SQL, expiredClaimsSQL.Args(map[string]any{"now": nowArg(p.Now), "max": p.Max})...)
	if err != nil {
		return 0, wrap(ctx, tx, "prune idempotency keys", err)
	}
	var ids []any
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, wrap(ctx, tx, "prune idempotency keys", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, wrap(ctx, tx, "prune idempotency keys", err)
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM txlimit_idempotency WHERE id IN (?"+strings.Repeat(", ?", len(ids)-1)+")", ids...)
	if err != nil {
		return 0, wrap(ctx, tx, "prune idempotency keys", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, s.CommitErr(ctx, err)
	}
	return int(n), nil
}

// PingClaims implements driver.Ops.
func (s *backend) PingClaims(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	_, err := s.db.ExecContext(ctx, probeClaimsSQL)
	return wrap(ctx, s.db, "ping", err)
}
