package engine

import (
	"context"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// HolderDialect is the operations of one database on the holders of
// concurrency limits (the txlimit_holder table), for Acquire.
type HolderDialect[TTx any] interface {
	// LockHolders creates the lock row of each of keys that has none and
	// locks it, waiting for other transactions, in the order of keys
	// (the canonical one); then it reads the holders of each key, the lock
	// row left out, with a read that sees every holder committed before it
	// held the lock (a new statement under READ COMMITTED, a locking read
	// on InnoDB; under REPEATABLE READ and SERIALIZABLE PostgreSQL fails
	// with a serialization error instead of locking a lock row a later
	// transaction changed), and the clock (or *now), read once every lock
	// is held. The Slots are in the order of keys.
	LockHolders(ctx context.Context, tx TTx, keys []driver.KeyRef, now *time.Time) ([]Slots, time.Time, error)

	// GrantHolders writes grants, each of a key whose lock row tx holds:
	// it deletes the holders of Reclaim that are still there (and expired),
	// inserts the holder or moves its expiry, and raises the lock row's
	// expiry to the holder's. It returns the holders each grant deleted.
	GrantHolders(ctx context.Context, tx TTx, grants []Grant) ([][]string, error)

	// DropLocks deletes the lock rows of keys, which tx created and holds.
	DropLocks(ctx context.Context, tx TTx, keys []driver.KeyRef) error
}

// Rates is what Acquire needs of a store's rate limits: its TakeAll and
// its Read.
type Rates[TTx any] interface {
	TakeAll(ctx context.Context, tx TTx, p driver.TakeAllParams) (driver.TakeAllResult, error)
	Read(ctx context.Context, tx TTx, p driver.ReadParams) (driver.ReadResult, error)
}

// Slots is what LockHolders holds of one key: its holders, and whether the
// call created its lock row.
type Slots struct {
	Holders []driver.Holder
	Created bool
}

// Grant is the write of one granted slot, decided at At.
type Grant struct {
	driver.KeyRef
	Holder  string
	Expires time.Time
	Reclaim []string
	At      time.Time
}

// Acquire is driver.Ops.Acquire on h (the slots) and rates (the takes):
// the slots' lock rows locked in the canonical order, before any row of a
// rate limit; each slot decided on its key's holders (driver.DecideSlot);
// the takes taken as TakeAll takes them, at the clock the slots were
// decided at, when every slot grants, and otherwise decided on their
// committed rows as TakeAll decides a limit it does not take; the grants
// written when everything granted, and otherwise the lock rows the call
// created deleted again.
func Acquire[TTx any](ctx context.Context, h HolderDialect[TTx], rates Rates[TTx], tx TTx, p driver.AcquireParams) (driver.AcquireResult, error) {
	order := driver.SlotOrder(p.Slots)
	keys := make([]driver.KeyRef, len(order))
	for i, j := range order {
		keys[i] = p.Slots[j].KeyRef
	}
	lt := LockTimer{On: p.TimeLocks}
	start := lt.Start()
	held, at, err := h.LockHolders(ctx, tx, keys, p.Now)
	lt.Stop(start)
	if err != nil {
		return driver.AcquireResult{}, err
	}
	out := driver.AcquireResult{OK: true, Slots: make([]driver.SlotResult, len(p.Slots)), At: at}
	for i, j := range order {
		out.Slots[j] = driver.DecideSlot(p.Slots[j], held[i].Holders, at)
		out.OK = out.OK && out.Slots[j].OK
	}
	if len(p.Takes) > 0 {
		now := &at // one clock for the call
		if out.OK {
			all, err := rates.TakeAll(ctx, tx, driver.TakeAllParams{Takes: p.Takes, Now: now, TimeLocks: p.TimeLocks})
			if err != nil {
				return driver.AcquireResult{}, err
			}
			out.OK, out.Takes = all.OK, all.Results
			lt.Total += all.LockWait
		} else {
			out.Takes = make([]driver.TakeResult, len(p.Takes))
			for i, t := range p.Takes {
				read, err := rates.Read(ctx, tx, driver.ReadParams{Name: t.Name, Key: t.Key, Now: now})
				if err != nil {
					return driver.AcquireResult{}, err
				}
				out.Takes[i] = driver.Check(t, read)
			}
		}
	}
	out.LockWait = lt.Total
	if !out.OK {
		var created []driver.KeyRef
		for i, j := range order {
			out.Slots[j] = driver.CheckSlot(p.Slots[j], held[i].Holders, at, 1)
			if held[i].Created {
				created = append(created, keys[i])
			}
		}
		if len(created) > 0 {
			if err := h.DropLocks(ctx, tx, created); err != nil {
				return driver.AcquireResult{}, err
			}
		}
		return out, nil
	}
	grants := make([]Grant, len(order))
	for i, j := range order {
		s := out.Slots[j]
		grants[i] = Grant{KeyRef: keys[i], Holder: p.Slots[j].Holder, Expires: s.Expires, Reclaim: s.Reclaimed, At: at}
	}
	reclaimed, err := h.GrantHolders(ctx, tx, grants)
	if err != nil {
		return driver.AcquireResult{}, err
	}
	for i, j := range order {
		out.Slots[j].Reclaimed = reclaimed[i]
	}
	return out, nil
}
