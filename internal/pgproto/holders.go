package pgproto

import (
	"context"
	"encoding/json"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// The operations of concurrency limits on PostgreSQL (the statements of
// queries/postgres/holders.sql). Write skew, two acquirers that each count
// Capacity-1 holders and both insert, is prevented by the key's lock row:
// every acquire locks it (LockHolderKey) and only then counts the holders,
// in a statement of its own (ReadHolders), which under READ COMMITTED sees
// every holder committed before the lock was held. Under REPEATABLE READ
// and SERIALIZABLE the count reads the transaction's snapshot, which may be
// older than the last grant; but every grant raises the lock row's expiry
// (GrantHolder), and locking a row that a transaction committed after the
// snapshot is a serialization failure (40001), so the count is never that
// stale. Extend locks the lock row too, so that an acquire never counts as
// expired a holder whose extension is committing.

// Acquire is driver.Ops.Acquire. One slot alone is LockHolderKey and
// AcquireHolder, which decides and writes in SQL: one round trip on pgx.
// Otherwise it is engine.Acquire on PostgreSQL's holder statements: on pgx
// the locks and the counts go in one round trip, the grants in one more,
// and the takes between them.
func (pr Protocol) Acquire(ctx context.Context, db DB, p driver.AcquireParams) (driver.AcquireResult, error) {
	if len(p.Slots) == 1 && len(p.Takes) == 0 {
		return pr.acquireOne(ctx, db, p)
	}
	return engine.Acquire[DB](ctx, dialect(pr), dialect(pr), db, p)
}

// acquireOne is Acquire of one slot: LockHolderKey and AcquireHolder.
func (pr Protocol) acquireOne(ctx context.Context, db DB, p driver.AcquireParams) (driver.AcquireResult, error) {
	s := p.Slots[0]
	lt := engine.LockTimer{On: p.TimeLocks}
	var created bool
	var row pgdb.AcquireHolderRow
	start := lt.Start()
	err := Send(ctx, db, func(q pgdb.DBTX) error {
		n, err := queries.LockHolderKey(ctx, q, pgdb.LockHolderKeyParams{Name: s.Name, Key: s.Key, Now: p.Now})
		created = n == 1
		return err
	}, func(q pgdb.DBTX) (err error) {
		row, err = queries.AcquireHolder(ctx, q, pgdb.AcquireHolderParams{Name: s.Name, Key: s.Key, Holder: s.Holder,
			Capacity: s.Capacity, HoldFor: s.HoldFor.Microseconds(), Now: p.Now})
		return err
	})
	lt.Stop(start)
	if err != nil {
		return driver.AcquireResult{}, err
	}
	res := driver.SlotResult{OK: row.Granted, Live: row.Live}
	switch {
	case row.Granted:
		res.Expires = row.Expires
		if !row.Mine {
			res.Live++
		}
		if err := json.Unmarshal([]byte(row.Reclaimed), &res.Reclaimed); err != nil {
			return driver.AcquireResult{}, err
		}
	default:
		res.Free = row.Free
		if created { // a key with no lock row has no holder: never here
			if err := dialect(pr).DropLocks(ctx, db, []driver.KeyRef{s.KeyRef}); err != nil {
				return driver.AcquireResult{}, err
			}
		}
	}
	return driver.AcquireResult{OK: res.OK, Slots: []driver.SlotResult{res}, At: row.Clock, LockWait: lt.Total}, nil
}

var _ engine.HolderDialect[DB] = dialect{}

// LockHolders runs LockHolderKey for every key, in their order, then
// ReadHolders for every key, in one round trip where db pipelines.
func (dialect) LockHolders(ctx context.Context, db DB, keys []driver.KeyRef, now *time.Time) ([]engine.Slots, time.Time, error) {
	out := make([]engine.Slots, len(keys))
	var at time.Time
	calls := make([]Call, 0, 2*len(keys))
	for i, k := range keys {
		calls = append(calls, func(q pgdb.DBTX) error {
			n, err := queries.LockHolderKey(ctx, q, pgdb.LockHolderKeyParams{Name: k.Name, Key: k.Key, Now: now})
			out[i].Created = n == 1
			return err
		})
	}
	for i, k := range keys {
		calls = append(calls, func(q pgdb.DBTX) error {
			holders, clock, err := readHolders(ctx, q, driver.ReadParams{Name: k.Name, Key: k.Key, Now: now})
			out[i].Holders = holders
			if at.IsZero() {
				at = clock
			}
			return err
		})
	}
	if err := Send(ctx, db, calls...); err != nil {
		return nil, time.Time{}, err
	}
	return out, at, nil
}

// readHolders runs ReadHolders.
func readHolders(ctx context.Context, q pgdb.DBTX, p driver.ReadParams) ([]driver.Holder, time.Time, error) {
	rows, err := queries.ReadHolders(ctx, q, pgdb.ReadHoldersParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return nil, time.Time{}, err
	}
	var out []driver.Holder
	var at time.Time
	for _, r := range rows {
		at = r.Clock
		if r.ExpiresAt != nil {
			out = append(out, driver.Holder{ID: r.Holder, Expires: *r.ExpiresAt})
		}
	}
	return out, at, nil
}

// GrantHolders runs GrantHolder for each grant, in one round trip where db
// pipelines.
func (dialect) GrantHolders(ctx context.Context, db DB, grants []engine.Grant) ([][]string, error) {
	out := make([][]string, len(grants))
	calls := make([]Call, len(grants))
	for i, g := range grants {
		var reclaim array
		for _, id := range g.Reclaim {
			reclaim.text(id)
		}
		calls[i] = func(q pgdb.DBTX) error {
			deleted, err := queries.GrantHolder(ctx, q, pgdb.GrantHolderParams{Name: g.Name, Key: g.Key, Holder: g.Holder,
				ExpiresAt: g.Expires, Reclaim: reclaim.String(), At: g.At})
			if err == nil {
				err = json.Unmarshal([]byte(deleted), &out[i])
			}
			return err
		}
	}
	return out, Send(ctx, db, calls...)
}

// DropLocks runs DropLock for each key.
func (dialect) DropLocks(ctx context.Context, db DB, keys []driver.KeyRef) error {
	calls := make([]Call, len(keys))
	for i, k := range keys {
		calls[i] = func(q pgdb.DBTX) error {
			return queries.DropLock(ctx, q, pgdb.DropLockParams{Name: k.Name, Key: k.Key})
		}
	}
	return Send(ctx, db, calls...)
}

// Release is driver.Ops.Release: ReleaseHolder.
func (Protocol) Release(ctx context.Context, db DB, p driver.HolderParams) (driver.HolderResult, error) {
	row, err := queries.ReleaseHolder(ctx, db, pgdb.ReleaseHolderParams{Name: p.Name, Key: p.Key, Holder: p.Holder, Now: p.Now})
	return driver.HolderResult{OK: row.Live, At: row.Clock}, err
}

// Extend is driver.Ops.Extend: LockHolderKey and ExtendHolder in one round
// trip where db pipelines, and DropLock when the key had no lock row (and
// so no live holder).
func (pr Protocol) Extend(ctx context.Context, db DB, p driver.HolderParams) (driver.HolderResult, error) {
	var created bool
	var row pgdb.ExtendHolderRow
	err := Send(ctx, db, func(q pgdb.DBTX) error {
		n, err := queries.LockHolderKey(ctx, q, pgdb.LockHolderKeyParams{Name: p.Name, Key: p.Key, Now: p.Now})
		created = n == 1
		return err
	}, func(q pgdb.DBTX) (err error) {
		row, err = queries.ExtendHolder(ctx, q, pgdb.ExtendHolderParams{Name: p.Name, Key: p.Key, Holder: p.Holder,
			HoldFor: p.HoldFor.Microseconds(), Now: p.Now})
		return err
	})
	if err == nil && created {
		err = dialect(pr).DropLocks(ctx, db, []driver.KeyRef{p.KeyRef})
	}
	out := driver.HolderResult{OK: row.ExpiresAt != nil, At: row.Clock}
	if out.OK {
		out.Expires = *row.ExpiresAt
	}
	return out, err
}

// Holders is driver.Ops.Holders: ReadHolders, which locks nothing.
func (Protocol) Holders(ctx context.Context, db DB, p driver.ReadParams) (driver.HoldersResult, error) {
	holders, at, err := readHolders(ctx, db, p)
	return driver.HoldersResult{Holders: holders, At: at}, err
}

// ResetHolders is driver.Ops.ResetHolders: DeleteHolders.
func (Protocol) ResetHolders(ctx context.Context, db DB, k driver.KeyRef) error {
	return queries.DeleteHolders(ctx, db, pgdb.DeleteHoldersParams{Name: k.Name, Key: k.Key})
}

// PruneHolders is one batch of driver.Ops.PruneHolders in db.
func (Protocol) PruneHolders(ctx context.Context, db DB, p driver.PruneHoldersParams) (int, error) {
	n, err := queries.PruneHolders(ctx, db, pgdb.PruneHoldersParams{MaxRows: int32(p.Max), Now: p.Now})
	return int(n), err
}

// PingHolders runs ProbeHolders, which fails when the txlimit_holder table
// or one of its columns is missing.
func PingHolders(ctx context.Context, db pgdb.DBTX) error { return queries.ProbeHolders(ctx, db) }

func (o *Ops[TTx]) Acquire(ctx context.Context, tx TTx, p driver.AcquireParams) (driver.AcquireResult, error) {
	res, err := o.Proto.Acquire(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) Release(ctx context.Context, tx TTx, p driver.HolderParams) (driver.HolderResult, error) {
	res, err := o.Proto.Release(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) Extend(ctx context.Context, tx TTx, p driver.HolderParams) (driver.HolderResult, error) {
	res, err := o.Proto.Extend(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) Holders(ctx context.Context, tx TTx, p driver.ReadParams) (driver.HoldersResult, error) {
	res, err := o.Proto.Holders(ctx, o.AsDB(tx), p)
	return res, o.Err(ctx, tx, err)
}

func (o *Ops[TTx]) ResetHolders(ctx context.Context, tx TTx, k driver.KeyRef) error {
	return o.Err(ctx, tx, o.Proto.ResetHolders(ctx, o.AsDB(tx), k))
}
