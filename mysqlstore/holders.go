package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	gen "github.com/txlimit/txlimit/mysqlstore/internal/db"
	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// The operations of concurrency limits on MySQL and MariaDB
// (queries/mysql/holders.sql). Every acquire creates or locks its key's lock
// row (INSERT … ON DUPLICATE KEY UPDATE: a record lock, no gap) and then
// counts the key's holders with a locking read, which reads the latest
// committed rows at every isolation level: two acquirers never both count
// Capacity-1 and both insert. Under REPEATABLE READ that read also locks the
// gap after the key's last holder, and a Release of a holder of the key
// waits for an acquiring transaction to end (the read locks the holders it
// counts). Extend locks the lock row too.

// deleteHoldersSQL deletes the listed rows of txlimit_holder by their
// primary keys (rawsql: JSON_TABLE).
var deleteHoldersSQL = rawsql.Get("DeleteHolderRows").SQL

var _ engine.HolderDialect[*sql.Tx] = holderDialect{}

// holderDialect is engine.HolderDialect on MySQL.
type holderDialect struct{}

// Acquire implements driver.Ops (engine.Acquire).
func (s *backend) Acquire(ctx context.Context, tx *sql.Tx, p driver.AcquireParams) (driver.AcquireResult, error) {
	return engine.Acquire(ctx, holderDialect{}, s, tx, p)
}

// holderClock is *now, or the server's clock read in tx.
func holderClock(ctx context.Context, tx *sql.Tx, now *time.Time) (time.Time, error) {
	if now != nil {
		return time.UnixMicro(now.UnixMicro()).UTC(), nil
	}
	clock, err := queries.HolderClock(ctx, tx)
	if err != nil {
		return time.Time{}, wrap(ctx, tx, "read the clock", err)
	}
	return clock, checkUTC(clock)
}

// lockHolderKey runs LockHolderKey: it reports whether it created the lock
// row.
func lockHolderKey(ctx context.Context, tx *sql.Tx, k driver.KeyRef) (bool, error) {
	n, err := queries.LockHolderKey(ctx, tx, gen.LockHolderKeyParams{Name: []byte(k.Name), Key: []byte(k.Key)})
	if err != nil {
		return false, wrap(ctx, tx, "lock the key's holders", err)
	}
	return n == 1, nil
}

// LockHolders implements engine.HolderDialect: LockHolderKey for each key,
// LockHolders for each, and then the clock.
func (holderDialect) LockHolders(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef, now *time.Time) ([]engine.Slots, time.Time, error) {
	out := make([]engine.Slots, len(keys))
	for i, k := range keys {
		var err error
		if out[i].Created, err = lockHolderKey(ctx, tx, k); err != nil {
			return nil, time.Time{}, err
		}
	}
	for i, k := range keys {
		rows, err := queries.LockHolders(ctx, tx, gen.LockHoldersParams{Name: []byte(k.Name), Key: []byte(k.Key)})
		if err != nil {
			return nil, time.Time{}, wrap(ctx, tx, "lock the key's holders", err)
		}
		for _, r := range rows {
			out[i].Holders = append(out[i].Holders, driver.Holder{ID: string(r.Holder), Expires: r.ExpiresAt})
		}
	}
	at, err := holderClock(ctx, tx, now)
	return out, at, err
}

// GrantHolders implements engine.HolderDialect: the holders to reclaim are
// locked (LockHolders), so each is deleted by its id.
func (holderDialect) GrantHolders(ctx context.Context, tx *sql.Tx, grants []engine.Grant) ([][]string, error) {
	out := make([][]string, len(grants))
	for i, g := range grants {
		name, key := []byte(g.Name), []byte(g.Key)
		for _, id := range g.Reclaim {
			n, err := queries.DeleteHolder(ctx, tx, gen.DeleteHolderParams{Name: name, Key: key, Holder: []byte(id)})
			if err != nil {
				return nil, wrap(ctx, tx, "reclaim holders", err)
			}
			if n == 1 {
				out[i] = append(out[i], id)
			}
		}
		if err := queries.PutHolder(ctx, tx, gen.PutHolderParams{Name: name, Key: key, Holder: []byte(g.Holder), ExpiresAt: g.Expires}); err != nil {
			return nil, wrap(ctx, tx, "write the holder", err)
		}
		if err := queries.RaiseLock(ctx, tx, gen.RaiseLockParams{Name: name, Key: key, ExpiresAt: g.Expires}); err != nil {
			return nil, wrap(ctx, tx, "write the holder", err)
		}
	}
	return out, nil
}

// DropLocks implements engine.HolderDialect.
func (holderDialect) DropLocks(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef) error {
	for _, k := range keys {
		if err := queries.DropLock(ctx, tx, gen.DropLockParams{Name: []byte(k.Name), Key: []byte(k.Key)}); err != nil {
			return wrap(ctx, tx, "delete the lock row", err)
		}
	}
	return nil
}

// Release implements driver.Ops: DeleteLiveHolder, and DeleteHolder when
// the holder was not live. A holder that is not there locks the gap where
// it would be, under REPEATABLE READ, until the transaction ends.
func (s *backend) Release(ctx context.Context, tx *sql.Tx, p driver.HolderParams) (driver.HolderResult, error) {
	at, err := holderClock(ctx, tx, p.Now)
	if err != nil {
		return driver.HolderResult{}, err
	}
	name, key, holder := []byte(p.Name), []byte(p.Key), []byte(p.Holder)
	n, err := queries.DeleteLiveHolder(ctx, tx, gen.DeleteLiveHolderParams{Name: name, Key: key, Holder: holder, Now: at})
	if err == nil && n == 0 {
		_, err = queries.DeleteHolder(ctx, tx, gen.DeleteHolderParams{Name: name, Key: key, Holder: holder})
	}
	return driver.HolderResult{OK: n == 1, At: at}, wrap(ctx, tx, "release the holder", err)
}

// Extend implements driver.Ops: LockHolderKey, the clock, ExtendHolder and
// RaiseLock, or DropLock when the key had no lock row.
func (s *backend) Extend(ctx context.Context, tx *sql.Tx, p driver.HolderParams) (driver.HolderResult, error) {
	created, err := lockHolderKey(ctx, tx, p.KeyRef)
	if err != nil {
		return driver.HolderResult{}, err
	}
	at, err := holderClock(ctx, tx, p.Now)
	if err != nil {
		return driver.HolderResult{}, err
	}
	out := driver.HolderResult{At: at}
	if created {
		return out, holderDialect{}.DropLocks(ctx, tx, []driver.KeyRef{p.KeyRef})
	}
	name, key := []byte(p.Name), []byte(p.Key)
	expires := at.Add(p.HoldFor)
	if err := checkTime("a holder's expiry", expires); err != nil {
		return out, err
	}
	n, err := queries.ExtendHolder(ctx, tx, gen.ExtendHolderParams{Name: name, Key: key, Holder: []byte(p.Holder), ExpiresAt: expires, Now: at})
	if err == nil && n == 0 {
		// No row changed: not live, or live with this expiry already.
		var held []time.Time
		held, err = queries.HolderExpiry(ctx, tx, gen.HolderExpiryParams{Name: name, Key: key, Holder: []byte(p.Holder)})
		if len(held) == 1 && held[0].Equal(expires) {
			n = 1
		}
	}
	if err == nil && n == 1 {
		out.OK, out.Expires = true, expires
		err = queries.RaiseLock(ctx, tx, gen.RaiseLockParams{Name: name, Key: key, ExpiresAt: expires})
	}
	return out, wrap(ctx, tx, "extend the holder", err)
}

// Holders implements driver.Ops with a consistent read, which locks
// nothing.
func (s *backend) Holders(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.HoldersResult, error) {
	rows, err := queries.ReadHolders(ctx, tx, gen.ReadHoldersParams{Name: []byte(p.Name), Key: []byte(p.Key)})
	if err != nil {
		return driver.HoldersResult{}, wrap(ctx, tx, "read holders", err)
	}
	out := driver.HoldersResult{Holders: make([]driver.Holder, len(rows))}
	for i, r := range rows {
		out.Holders[i] = driver.Holder{ID: string(r.Holder), Expires: r.ExpiresAt}
	}
	out.At, err = holderClock(ctx, tx, p.Now)
	return out, err
}

// ResetHolders implements driver.Ops.
func (s *backend) ResetHolders(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	err := queries.DeleteHolders(ctx, tx, gen.DeleteHoldersParams{Name: []byte(k.Name), Key: []byte(k.Key)})
	return wrap(ctx, tx, "delete the holders", err)
}

// PruneHolders implements driver.Ops: one batch in a READ COMMITTED
// transaction of its own, which locks the expired rows no other transaction
// holds (ExpiredHolders) and deletes them.
func (s *backend) PruneHolders(ctx context.Context, p driver.PruneHoldersParams) (int, error) {
	if s.db == nil {
		return 0, driver.ErrNoPool
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, s.BeginErr(ctx, err)
	}
	defer func() { _ = tx.Rollback() }()
	at, err := holderClock(ctx, tx, p.Now)
	if err != nil {
		return 0, err
	}
	rows, err := queries.ExpiredHolders(ctx, tx, gen.ExpiredHoldersParams{Now: at, Limit: int32(p.Max)})
	if err != nil || len(rows) == 0 {
		return 0, wrap(ctx, tx, "prune holders", err)
	}
	list := make([][3]string, len(rows))
	for i, r := range rows {
		list[i] = [3]string{hex.EncodeToString(r.Name), hex.EncodeToString(r.Key), hex.EncodeToString(r.Holder)}
	}
	arg, err := json.Marshal(list)
	if err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, deleteHoldersSQL, arg)
	if err != nil {
		return 0, wrap(ctx, tx, "prune holders", err)
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

// PingHolders implements driver.Ops.
func (s *backend) PingHolders(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	return wrap(ctx, s.db, "ping", queries.ProbeHolders(ctx, s.db))
}
