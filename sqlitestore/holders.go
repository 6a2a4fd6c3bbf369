package sqlitestore

import (
	"context"
	"database/sql"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	gen "github.com/txlimit/txlimit/sqlitestore/internal/db"
)

// The operations of concurrency limits on SQLite (queries/sqlite/holders.sql).
// SQLite has one writer at a time: an acquire's first statement on a key
// (TouchHolderKey) is a write, which takes the database's write lock, so the
// count that follows and the insert after it are never interleaved with
// another transaction's (no write skew at SQLite's only isolation level,
// SERIALIZABLE). The clock is the process's, or Options.Clock.

var _ engine.HolderDialect[*sql.Tx] = (*backend)(nil)

// Acquire implements driver.Ops (engine.Acquire).
func (s *backend) Acquire(ctx context.Context, tx *sql.Tx, p driver.AcquireParams) (driver.AcquireResult, error) {
	return engine.Acquire(ctx, s, s, tx, p)
}

// LockHolders implements engine.HolderDialect: TouchHolderKey for each key
// (the first takes the write lock), then ReadHolders for each.
func (s *backend) LockHolders(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef, now *time.Time) ([]engine.Slots, time.Time, error) {
	at := clock(now)
	out := make([]engine.Slots, len(keys))
	for i, k := range keys {
		n, err := s.queries.TouchHolderKey(ctx, s.on(tx), gen.TouchHolderKeyParams{Name: k.Name, Key: k.Key, Now: at.UnixMicro()})
		if err != nil {
			return nil, time.Time{}, wrap(ctx, tx, "lock the key's holders", err)
		}
		out[i].Created = n == 1
	}
	for i, k := range keys {
		var err error
		if out[i].Holders, err = s.holders(ctx, tx, k); err != nil {
			return nil, time.Time{}, err
		}
	}
	return out, at, nil
}

// holders runs ReadHolders.
func (s *backend) holders(ctx context.Context, tx *sql.Tx, k driver.KeyRef) ([]driver.Holder, error) {
	rows, err := s.queries.ReadHolders(ctx, s.on(tx), gen.ReadHoldersParams{Name: k.Name, Key: k.Key})
	if err != nil {
		return nil, wrap(ctx, tx, "read holders", err)
	}
	out := make([]driver.Holder, len(rows))
	for i, r := range rows {
		out[i] = driver.Holder{ID: r.Holder, Expires: time.UnixMicro(r.ExpiresAt)}
	}
	return out, nil
}

// GrantHolders implements engine.HolderDialect: under the write lock the
// holders read are the holders there are, so each one to reclaim is
// deleted by its id.
func (s *backend) GrantHolders(ctx context.Context, tx *sql.Tx, grants []engine.Grant) ([][]string, error) {
	out := make([][]string, len(grants))
	for i, g := range grants {
		for _, id := range g.Reclaim {
			n, err := s.queries.DeleteHolder(ctx, s.on(tx), gen.DeleteHolderParams{Name: g.Name, Key: g.Key, Holder: id})
			if err != nil {
				return nil, wrap(ctx, tx, "reclaim holders", err)
			}
			if n == 1 {
				out[i] = append(out[i], id)
			}
		}
		expires := g.Expires.UnixMicro()
		if err := s.queries.PutHolder(ctx, s.on(tx), gen.PutHolderParams{Name: g.Name, Key: g.Key, Holder: g.Holder, ExpiresAt: expires}); err != nil {
			return nil, wrap(ctx, tx, "write the holder", err)
		}
		if err := s.queries.RaiseLock(ctx, s.on(tx), gen.RaiseLockParams{Name: g.Name, Key: g.Key, ExpiresAt: expires}); err != nil {
			return nil, wrap(ctx, tx, "write the holder", err)
		}
	}
	return out, nil
}

// DropLocks implements engine.HolderDialect.
func (s *backend) DropLocks(ctx context.Context, tx *sql.Tx, keys []driver.KeyRef) error {
	for _, k := range keys {
		if err := s.queries.DropLock(ctx, s.on(tx), gen.DropLockParams{Name: k.Name, Key: k.Key}); err != nil {
			return wrap(ctx, tx, "delete the lock row", err)
		}
	}
	return nil
}

// Release implements driver.Ops: DeleteLiveHolder, and DeleteHolder when
// the holder was not live.
func (s *backend) Release(ctx context.Context, tx *sql.Tx, p driver.HolderParams) (driver.HolderResult, error) {
	at := clock(p.Now)
	n, err := s.queries.DeleteLiveHolder(ctx, s.on(tx), gen.DeleteLiveHolderParams{Name: p.Name, Key: p.Key, Holder: p.Holder, Now: at.UnixMicro()})
	if err == nil && n == 0 {
		_, err = s.queries.DeleteHolder(ctx, s.on(tx), gen.DeleteHolderParams{Name: p.Name, Key: p.Key, Holder: p.Holder})
	}
	return driver.HolderResult{OK: n == 1, At: at}, wrap(ctx, tx, "release the holder", err)
}

// Extend implements driver.Ops: TouchHolderKey (the write lock), then
// ExtendHolder and RaiseLock, or DropLock when the key had no lock row.
func (s *backend) Extend(ctx context.Context, tx *sql.Tx, p driver.HolderParams) (driver.HolderResult, error) {
	at := clock(p.Now)
	out := driver.HolderResult{At: at}
	created, err := s.queries.TouchHolderKey(ctx, s.on(tx), gen.TouchHolderKeyParams{Name: p.Name, Key: p.Key, Now: at.UnixMicro()})
	if err != nil {
		return out, wrap(ctx, tx, "lock the key's holders", err)
	}
	if created == 1 {
		return out, wrap(ctx, tx, "delete the lock row", s.queries.DropLock(ctx, s.on(tx), gen.DropLockParams{Name: p.Name, Key: p.Key}))
	}
	expires := at.Add(p.HoldFor)
	n, err := s.queries.ExtendHolder(ctx, s.on(tx), gen.ExtendHolderParams{Name: p.Name, Key: p.Key, Holder: p.Holder,
		ExpiresAt: expires.UnixMicro(), Now: at.UnixMicro()})
	if err == nil && n == 1 {
		out.OK, out.Expires = true, expires
		err = s.queries.RaiseLock(ctx, s.on(tx), gen.RaiseLockParams{Name: p.Name, Key: p.Key, ExpiresAt: expires.UnixMicro()})
	}
	return out, wrap(ctx, tx, "extend the holder", err)
}

// Holders implements driver.Ops with a plain SELECT, which takes no write
// lock.
func (s *backend) Holders(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.HoldersResult, error) {
	holders, err := s.holders(ctx, tx, driver.KeyRef{Name: p.Name, Key: p.Key})
	return driver.HoldersResult{Holders: holders, At: clock(p.Now)}, err
}

// ResetHolders implements driver.Ops.
func (s *backend) ResetHolders(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	return wrap(ctx, tx, "delete the holders", s.queries.DeleteHolders(ctx, s.on(tx), gen.DeleteHoldersParams{Name: k.Name, Key: k.Key}))
}

// PruneHolders implements driver.Ops: one batch under the write lock, like
// any writer.
func (s *backend) PruneHolders(ctx context.Context, p driver.PruneHoldersParams) (n int, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) error {
		deleted, err := s.queries.PruneHolders(ctx, s.on(tx), gen.PruneHoldersParams{Now: clock(p.Now).UnixMicro(), MaxRows: int64(p.Max)})
		n = int(deleted)
		return wrap(ctx, tx, "prune holders", err)
	})
	return n, err
}

// PingHolders implements driver.Ops.
func (s *backend) PingHolders(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	return wrap(ctx, s.db, "ping", s.queries.ProbeHolders(ctx, s.db))
}
