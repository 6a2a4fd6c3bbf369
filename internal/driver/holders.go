package driver

import (
	"slices"
	"time"
)

// The operations of concurrency limits (txlimit.Concurrency) are on a table
// of their own, txlimit_holder: one row per holder of a slot of (name, key),
// with the instant it expires, and one lock row per key (holder ""), which
// every call that counts or extends the key's holders locks first. The lock
// row is never counted; its expiry is the latest of every holder it saw
// granted or extended, so that Prune can delete it once that has passed.

// Holder is one holder of a slot of a key.
type Holder struct {
	ID      string
	Expires time.Time
}

// SlotParams is the acquire of one slot of a concurrency limit.
type SlotParams struct {
	KeyRef
	Holder   string
	Capacity int64
	HoldFor  time.Duration
}

// SlotResult is what an acquire decided for one slot.
type SlotResult struct {
	// OK reports a grant: the holder is new, or was live and its expiry was
	// pushed.
	OK bool
	// Live is how many live holders the key has after the call (before it,
	// for a denial).
	Live int64
	// Free is, for a denial, the instant a slot is expected back: when
	// enough live holders will have expired for the call to be granted.
	Free time.Time
	// Expires is the holder's expiry after a grant.
	Expires time.Time
	// Reclaimed are the expired holders the grant deleted.
	Reclaimed []string
}

// AcquireParams is one Acquire: slots of concurrency limits and takes of
// rate limits, all granted or none. The keys of Slots are distinct.
type AcquireParams struct {
	Slots     []SlotParams
	Takes     []TakeParams
	Now       *time.Time
	TimeLocks bool
}

// AcquireResult is what Acquire decided. When OK is false nothing was
// written; each result is still that limit's own decision.
type AcquireResult struct {
	OK       bool
	Slots    []SlotResult // in the order of AcquireParams.Slots
	Takes    []TakeResult // in the order of AcquireParams.Takes
	At       time.Time
	LockWait time.Duration
}

// HolderParams names one holder, for Release and Extend (HoldFor).
type HolderParams struct {
	KeyRef
	Holder  string
	HoldFor time.Duration
	Now     *time.Time
}

// HolderResult is what Release or Extend did: OK when the holder was live
// (and is released, or extended until Expires).
type HolderResult struct {
	OK      bool
	Expires time.Time
	At      time.Time
}

// HoldersResult is every holder of a key (live or expired, the lock row
// left out), in order of expiry, and the clock.
type HoldersResult struct {
	Holders []Holder
	At      time.Time
}

// PruneHoldersParams is one batch of the holders' Prune.
type PruneHoldersParams struct {
	Max int
	Now *time.Time
}

// Live returns the holders of holders that are live at now.
func Live(holders []Holder, now time.Time) []Holder {
	var out []Holder
	for _, h := range holders {
		if h.Expires.After(now) {
			out = append(out, h)
		}
	}
	return out
}

// DecideSlot is the decision of an acquire of p on holders, every holder
// of p's key as the store holds them under the key's lock, at now: granted
// when fewer than Capacity holders are live, or when p.Holder is one of
// them; a grant reclaims every expired holder but p.Holder's own row, and
// gives p.Holder the expiry now + HoldFor. A denial's Free is when the
// live holders beyond Capacity - 1 have expired.
func DecideSlot(p SlotParams, holders []Holder, now time.Time) SlotResult {
	live := Live(holders, now)
	mine := slices.ContainsFunc(live, func(h Holder) bool { return h.ID == p.Holder })
	if !mine && int64(len(live)) >= p.Capacity {
		slices.SortFunc(live, func(a, b Holder) int { return a.Expires.Compare(b.Expires) })
		return SlotResult{Live: int64(len(live)), Free: live[int64(len(live))-p.Capacity].Expires}
	}
	res := SlotResult{OK: true, Live: int64(len(live)), Expires: now.Add(p.HoldFor)}
	if !mine {
		res.Live++
	}
	for _, h := range holders {
		if !h.Expires.After(now) && h.ID != p.Holder {
			res.Reclaimed = append(res.Reclaimed, h.ID)
		}
	}
	return res
}

// CheckSlot is what an acquire of p would decide on holders at now, taking
// nothing: Live is how many are live now. With count 0 it asks for no slot,
// and is granted.
func CheckSlot(p SlotParams, holders []Holder, now time.Time, count float64) SlotResult {
	live := int64(len(Live(holders, now)))
	if count == 0 {
		return SlotResult{OK: true, Live: live}
	}
	res := DecideSlot(p, holders, now)
	return SlotResult{OK: res.OK, Live: live, Free: res.Free}
}

// SlotOrder returns the indexes of slots sorted by name, then key, byte by
// byte: the order in which Acquire locks the keys' lock rows (before any
// row of a rate limit).
func SlotOrder(slots []SlotParams) []int {
	takes := make([]TakeParams, len(slots))
	for i, s := range slots {
		takes[i].Name, takes[i].Key = s.Name, s.Key
	}
	return CanonicalOrder(takes)
}
