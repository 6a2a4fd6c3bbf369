// Package engine is the take flow of txlimit's stores, written once over the
// row operations each database supplies (a Dialect): the one-statement take
// of an unsharded limit, a sharded limit's fast path (one shard no other
// transaction holds), the locked path (every row of the key locked, decided
// by package driver, written), TakeAll in the canonical order, Credit, and
// a batch of Prune.
//
// A Dialect says where its database differs by the interfaces it adds
// (SkipLocker, Releaser, FreeLocker); its SQL and errors are its own. The
// engine sends nothing between a dialect's operations, so that each is one
// round trip where the driver pipelines.
package engine

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// Dialect is the row operations of one database in a transaction of type
// TTx (or the adapter the store runs its statements on).
type Dialect[TTx any] interface {
	// TakeRow takes p from the one row of an unsharded limit in one
	// statement that refills, decides and writes (driver.InSQL(p) holds).
	// ok is false when it granted nothing: the locked path then decides.
	TakeRow(ctx context.Context, tx TTx, p driver.TakeParams) (res driver.TakeResult, ok bool, err error)

	// Read is driver.Ops.Read: the rows of (Name, Key) as tx sees them,
	// locking nothing, and the clock.
	Read(ctx context.Context, tx TTx, p driver.ReadParams) (driver.ReadResult, error)

	// LockKey locks every row of l's key in shard order, waiting for other
	// transactions, and reads them with the clock (or *now). A key with no
	// row gets rows 0..Shards-1, created full, when create is set (always,
	// where locking a missing row would take a gap lock), and otherwise
	// Locked.None; where the lock covers every row (SQLite), none.
	LockKey(ctx context.Context, tx TTx, l driver.Limit, now *time.Time, create bool) (Locked, error)

	// LockKeys is LockKey with create for each limit of ls, in their
	// order (the canonical one) and then in shard order, with one clock.
	LockKeys(ctx context.Context, tx TTx, ls []driver.Limit, now *time.Time) (keys []Locked, at time.Time, err error)

	// Write stores each KeyWrite's states in rows 0..len(States)-1 of its
	// key, creating those its Locked does not hold, and deletes the rows of
	// deletes: all rows tx holds. deleted is the number of rows deleted.
	Write(ctx context.Context, tx TTx, writes []KeyWrite, deletes []RowRef) (deleted int64, err error)

	// ScanKeys returns up to max keys after the cursor, in the dialect's key
	// order, locking nothing.
	ScanKeys(ctx context.Context, tx TTx, after driver.KeyRef, max int) ([]Key, error)

	// LockIdle locks the rows of keys, passing over rows other transactions
	// hold where the database can, and returns what it holds per key, in
	// the order of keys, with the clock.
	LockIdle(ctx context.Context, tx TTx, keys []Key, now *time.Time) (held []Held, at time.Time, err error)
}

// SkipLocker is a Dialect whose database locks rows and can pass over those
// other transactions hold (SKIP LOCKED: PostgreSQL, InnoDB). A sharded limit
// is then served from one free shard that has the tokens, and a denial the
// committed rows decide is answered before any wait. Without it (SQLite,
// whose writer holds the whole database) every call takes the locked path.
type SkipLocker[TTx any] interface {
	// TryShard locks the first shard of order, of p's key, that no other
	// transaction holds, without waiting. order is every shard from a random
	// one round, or, without a Releaser, those the committed rows give twice
	// the count. A Releaser may wait for order[0] when every row of the key
	// is held, since it holds nothing of the key while it waits.
	TryShard(ctx context.Context, tx TTx, p driver.TakeParams, order []int32) (Tried, error)

	// KeepShards writes rows, shards that TryShard or TryShards locked, and
	// keeps their locks (a Releaser ends TryShard's savepoint).
	KeepShards(ctx context.Context, tx TTx, l driver.Limit, rows []driver.Row) error
}

// Releaser is a SkipLocker that can let go of a shard that falls short
// (PostgreSQL locks it in a savepoint); the call then locks every shard.
type Releaser[TTx any] interface {
	// LetGo releases what TryShard locked (or tried to), taking nothing.
	LetGo(ctx context.Context, tx TTx) error
}

// FreeLocker is a SkipLocker that holds what TryShard locked until the
// transaction ends (InnoDB). Holding a shard, a call must not wait for
// another, which a call locking every shard in order may hold while it
// waits for this one: the committed rows choose the shard, and one that
// falls short is decided with the other free shards (takeFromFree).
type FreeLocker[TTx any] interface {
	// TryShards locks the rows of shards of p's key that no other
	// transaction holds, without waiting, and reads them.
	TryShards(ctx context.Context, tx TTx, p driver.TakeParams, shards []int32) ([]driver.Row, error)
}

// Locked is every row of one key that the transaction holds.
type Locked struct {
	// Had are the key's rows as they were before the call.
	Had []driver.Row
	// Created are the shards of the full rows the call created to lock
	// them, deleted again when it writes none (forget).
	Created []int32
	At      time.Time
	// None reports a key without rows where none was created: nothing is
	// held, and At is not read.
	None bool
}

// Holds reports whether the transaction holds row shard of the key.
func (k Locked) Holds(shard int32) bool {
	return slices.Contains(k.Created, shard) || slices.ContainsFunc(k.Had, func(r driver.Row) bool { return r.Shard == shard })
}

// KeyWrite is the new state of rows 0..len(States)-1 of a key.
type KeyWrite struct {
	driver.Limit
	States []algo.State
	Locked Locked
	// Paused is the pause every written row gets (paused_until): the key's
	// pause when it is still on (driver.LivePause), zero (NULL) otherwise,
	// which clears one that has ended.
	Paused time.Time
}

// RowRef names one row.
type RowRef struct {
	driver.KeyRef
	Shard int32
}

// Tried is what TryShard locked.
type Tried struct {
	Row    driver.Row
	Locked bool
	// Top is the highest shard the key has (the locked path reshards rows
	// another Shards wrote). All is every row of the key, where the dialect
	// reads them with p.ReadAll.
	Top int32
	All []driver.Row
	Now time.Time
}

// Key is a key ScanKeys found, with its rows and highest shard where the
// scan reads them.
type Key struct {
	driver.KeyRef
	Rows int64
	Top  int32
}

// Held is what LockIdle holds of a key: Whole when that is every row.
type Held struct {
	driver.KeyRef
	Rows  []driver.Row
	Whole bool
}

// Granted is the result of TakeRow's grant, next being the new state.
func Granted(p driver.TakeParams, next algo.State, at time.Time) driver.TakeResult {
	return driver.TakeResult{Decision: driver.Granted(p.Config, next, at.UnixMicro()), At: at,
		States: []algo.State{next}, Taken: p.Count}
}

// Take is driver.Ops.Take on d.
func Take[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, p driver.TakeParams) (res driver.TakeResult, err error) {
	lt := &LockTimer{On: p.TimeLocks}
	defer func() { res.LockWait = lt.Total }()
	if p.Shards == 1 && driver.InSQL(p) {
		start := lt.Start()
		res, ok, err := d.TakeRow(ctx, tx, p)
		lt.Stop(start)
		if err != nil || ok {
			return res, err
		}
	}
	if sl, ok := d.(SkipLocker[TTx]); ok && p.Shards > 1 {
		res, done, err := takeSharded(ctx, d, sl, tx, p, lt)
		if err != nil || done {
			return res, err
		}
	}
	// A key with no row is full: its rows are created only when that grants.
	grantsWhenFull := driver.Check(p, driver.ReadResult{At: time.UnixMicro(p.Full().TS)}).Decision.OK
	start := lt.Start()
	k, err := d.LockKey(ctx, tx, p.Limit, p.Now, grantsWhenFull)
	lt.Stop(start)
	switch {
	case err != nil:
		return driver.TakeResult{}, err
	case k.None:
		// A missing key is full: when even that does not grant (a
		// reservation beyond its cap), the committed state decides.
		read, err := d.Read(ctx, tx, driver.ReadParams{Name: p.Name, Key: p.Key, Now: p.Now})
		if err != nil {
			return driver.TakeResult{}, err
		}
		return driver.Check(p, read), nil
	}
	res, write := driver.Decide(p, k.Had, k.At)
	if write {
		err = store(ctx, d, tx, p.Limit, k, res.States)
	} else {
		err = forget(ctx, d, tx, p.Limit, k)
	}
	if err != nil {
		return driver.TakeResult{}, err
	}
	return res, nil
}

// takeSharded is what a sharded limit tries before it locks every shard:
// one shard no other transaction holds, and a denial on the committed rows,
// right without a lock since concurrent transactions can only lower them
// (a concurrent Credit or Reset is ordered after this call). done is false
// when the locked path decides.
func takeSharded[TTx any](ctx context.Context, d Dialect[TTx], sl SkipLocker[TTx], tx TTx, p driver.TakeParams, lt *LockTimer) (driver.TakeResult, bool, error) {
	rel, releases := d.(Releaser[TTx])
	fl, _ := d.(FreeLocker[TTx])
	committed := func() (driver.TakeResult, driver.ReadResult, error) {
		read, err := d.Read(ctx, tx, driver.ReadParams{Name: p.Name, Key: p.Key, Now: p.Now})
		if err != nil {
			return driver.TakeResult{}, read, err
		}
		return driver.Check(p, read), read, nil
	}
	// One shard may serve a count it can hold, without UpTo.
	fits := !p.UpTo && p.Count <= p.Shard(p.Shards).Capacity
	// Without a Releaser the committed rows come first, where every shard
	// has its row: they choose the shard to lock (snapshot), since a lock
	// taken stays.
	var snapshot []algo.State
	var read driver.ReadResult
	if !releases && !p.Reserve && fits {
		res, r, err := committed()
		if err != nil {
			return res, false, err
		}
		if _, resharded := p.States(r.Rows, r.At.UnixMicro()); !resharded && len(r.Rows) == p.Shards {
			if !res.Decision.OK {
				return res, true, nil
			}
			snapshot, read = res.States, r
		}
	}
	if fits && (releases || fl != nil && snapshot != nil) {
		order := make([]int32, 0, p.Shards)
		start := rand.IntN(p.Shards)
		for i := range p.Shards {
			sh := (start + i) % p.Shards
			if snapshot == nil || algo.Pooled(p.Shard(p.Shards), snapshot[sh:sh+1], read.At.UnixMicro()) >= 2*p.Count {
				order = append(order, int32(sh))
			}
		}
		res, done, err := takeOneShard(ctx, sl, rel, fl, tx, p, order, snapshot, lt)
		if err != nil || done {
			return res, done, err
		}
	}
	if releases && !p.Reserve {
		res, _, err := committed()
		return res, err != nil || !res.Decision.OK, err
	}
	return driver.TakeResult{}, false, nil
}

// takeOneShard locks the first free shard of order and takes from it alone
// when it has the tokens; otherwise a Releaser lets it go, and a FreeLocker
// decides on the free shards.
func takeOneShard[TTx any](ctx context.Context, sl SkipLocker[TTx], rel Releaser[TTx], fl FreeLocker[TTx], tx TTx,
	p driver.TakeParams, order []int32, snapshot []algo.State, lt *LockTimer,
) (driver.TakeResult, bool, error) {
	if len(order) == 0 {
		return driver.TakeResult{}, false, nil
	}
	start := lt.Start()
	t, err := sl.TryShard(ctx, tx, p, order)
	lt.Stop(start)
	if err != nil {
		// A savepoint may be open: the transaction has failed anyway.
		return driver.TakeResult{}, false, err
	}
	if t.Locked && t.Row.Paused.After(t.Now) {
		// Every row of a paused key holds its pause.
		res := driver.TakeResult{Decision: driver.PausedDecision(t.Row.Paused, t.Now), At: t.Now, Paused: true, States: snapshot}
		if res.States == nil && p.ReadAll {
			res.States, _ = p.States(t.All, t.Now.UnixMicro())
		}
		res.Partial = res.States == nil
		if rel != nil {
			return res, true, rel.LetGo(ctx, tx)
		}
		return res, true, nil
	}
	if t.Locked && t.Top == int32(p.Shards-1) {
		next, d := algo.Take(p.Shard(p.Shards), t.Row.State(), t.Now.UnixMicro(), p.Count, false)
		if d.OK {
			if err := sl.KeepShards(ctx, tx, p.Limit, []driver.Row{row(t.Row.Shard, next)}); err != nil {
				return driver.TakeResult{}, false, err
			}
			res := driver.TakeResult{Decision: d, At: t.Now, Partial: true, Taken: p.Count}
			if p.ReadAll {
				states := slices.Clone(snapshot)
				if states == nil {
					states, _ = p.States(t.All, t.Now.UnixMicro())
				}
				states[t.Row.Shard] = next
				res.States, res.Partial = states, false
			}
			return res, true, nil
		}
		if rel == nil {
			return takeFromFree(ctx, sl, fl, tx, p, t.Row, snapshot, t.Now)
		}
	}
	// The shard falls short, every row is missing or held, or the key has
	// rows of another Shards (Top).
	if rel == nil {
		return driver.TakeResult{}, false, nil
	}
	return driver.TakeResult{}, false, rel.LetGo(ctx, tx)
}

// takeFromFree decides a call whose held shard falls short, without waiting
// for another (FreeLocker): it locks the other free shards and decides on
// all it holds as on one limit of that many shards (algo.TakeShards), which
// never admits more than the whole limit could, and denies with a wait no
// shorter than the whole limit's. snapshot is every shard as committed.
func takeFromFree[TTx any](ctx context.Context, sl SkipLocker[TTx], fl FreeLocker[TTx], tx TTx, p driver.TakeParams,
	held driver.Row, snapshot []algo.State, now time.Time,
) (driver.TakeResult, bool, error) {
	others := make([]int32, 0, p.Shards-1)
	for sh := range int32(p.Shards) {
		if sh != held.Shard {
			others = append(others, sh)
		}
	}
	free, err := fl.TryShards(ctx, tx, p, others)
	if err != nil {
		return driver.TakeResult{}, false, err
	}
	rows := append([]driver.Row{held}, free...)
	slices.SortFunc(rows, func(a, b driver.Row) int { return cmp.Compare(a.Shard, b.Shard) })
	states := make([]algo.State, len(rows))
	for i, r := range rows {
		states[i] = r.State()
	}
	next, d := algo.TakeShards(p.Shard(p.Shards), states, now.UnixMicro(), p.Count, false)
	if !d.OK {
		next = states
	}
	res := driver.TakeResult{Decision: d, At: now}
	switch {
	case len(rows) == p.Shards:
		res.States = next
	case p.ReadAll || !d.OK:
		res.States = slices.Clone(snapshot)
		for i, r := range rows {
			res.States[r.Shard] = next[i]
		}
	}
	res.Partial = res.States == nil
	if !d.OK {
		return res, true, nil
	}
	res.Taken = p.Count
	for i, r := range rows {
		rows[i] = row(r.Shard, next[i])
	}
	if err := sl.KeepShards(ctx, tx, p.Limit, rows); err != nil {
		return driver.TakeResult{}, false, err
	}
	return res, true, nil
}

// TakeAll is driver.Ops.TakeAll on d: it locks in the canonical order,
// decides (driver.DecideAll) and writes, or deletes the rows it created for
// a limit that keeps its rows.
func TakeAll[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	order := driver.CanonicalOrder(p.Takes)
	limits := make([]driver.Limit, len(order))
	for i, j := range order {
		limits[i] = p.Takes[j].Limit
	}
	lt := LockTimer{On: p.TimeLocks}
	start := lt.Start()
	locked, at, err := d.LockKeys(ctx, tx, limits, p.Now)
	lt.Stop(start)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	keys := make([]Locked, len(order))
	had := make([][]driver.Row, len(order))
	for i, j := range order {
		keys[j], had[j] = locked[i], locked[i].Had
	}
	out, writes := driver.DecideAll(p, had, at)
	out.LockWait = lt.Total
	var kw []KeyWrite
	var deletes []RowRef
	for i, t := range p.Takes {
		if writes[i] == nil {
			deletes = append(deletes, refs(t.Limit, keys[i].Created)...)
			continue
		}
		kw = append(kw, KeyWrite{Limit: t.Limit, States: out.Results[i].States, Locked: keys[i], Paused: driver.LivePause(keys[i].Had, at)})
		deletes = append(deletes, extra(t.Limit, keys[i].Had)...)
	}
	if len(kw) > 0 || len(deletes) > 0 {
		if _, err := d.Write(ctx, tx, kw, deletes); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	return out, nil
}

// Credit is driver.Ops.Credit on d. A key with no row is full already.
func Credit[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, p driver.CreditParams) error {
	k, err := d.LockKey(ctx, tx, p.Limit, p.Now, false)
	switch {
	case err != nil || k.None:
		return err
	case len(k.Had) == 0:
		return forget(ctx, d, tx, p.Limit, k)
	}
	at := k.At.UnixMicro()
	states, _ := p.States(k.Had, at)
	return store(ctx, d, tx, p.Limit, k, algo.CreditShards(p.Shard(p.Shards), states, at, p.Count))
}

// Prune is one batch of driver.Ops.Prune on d, in tx: it deletes the rows
// of every key it holds whole and finds full.
func Prune[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, p driver.PruneParams) (driver.PruneResult, error) {
	keys, err := d.ScanKeys(ctx, tx, p.After, p.Max)
	if err != nil || len(keys) == 0 {
		return driver.PruneResult{}, err
	}
	out := driver.PruneResult{Keys: len(keys), Last: keys[len(keys)-1].KeyRef}
	var known []Key
	for _, k := range keys {
		if _, ok := p.Limits[k.Name]; ok {
			known = append(known, k)
		} else {
			out.Unknown++
		}
	}
	if len(known) == 0 {
		return out, nil
	}
	held, at, err := d.LockIdle(ctx, tx, known, p.Now)
	if err != nil {
		return driver.PruneResult{}, err
	}
	var deletes []RowRef
	for _, h := range held {
		if h.Whole && p.Full(h.Name, h.Key, h.Rows, at) {
			for _, r := range h.Rows {
				deletes = append(deletes, RowRef{h.KeyRef, r.Shard})
			}
		}
	}
	if len(deletes) > 0 {
		n, err := d.Write(ctx, tx, nil, deletes)
		if err != nil {
			return driver.PruneResult{}, err
		}
		out.Deleted = int(n)
	}
	return out, nil
}

// store writes states to rows 0..Shards-1 of l's key, of which the
// transaction holds k, and deletes the rows beyond them.
func store[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, l driver.Limit, k Locked, states []algo.State) error {
	_, err := d.Write(ctx, tx, []KeyWrite{{Limit: l, States: states, Locked: k, Paused: driver.LivePause(k.Had, k.At)}}, extra(l, k.Had))
	return err
}

// Pause is driver.Ops.Pause on d: it locks the key's rows (creating those
// of p's layout, full, for a pause of a key without rows) and writes them
// with the pause, as a take of nothing would write them (resharded to p's
// Shards, projected to the clock), so that no decision changes. A pause
// that is not after the clock lifts; lifting a key without rows writes
// nothing.
func Pause[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, p driver.PauseParams) error {
	k, err := d.LockKey(ctx, tx, p.Limit, p.Now, !p.Until.IsZero())
	if err != nil || k.None {
		return err
	}
	until := p.Until
	if !until.After(k.At) {
		until = time.Time{}
	}
	if len(k.Had) == 0 && until.IsZero() {
		return forget(ctx, d, tx, p.Limit, k)
	}
	at := k.At.UnixMicro()
	states, _ := p.States(k.Had, at)
	c := p.Shard(p.Shards)
	for i, s := range states {
		states[i] = algo.Project(c, s, at)
	}
	_, err = d.Write(ctx, tx, []KeyWrite{{Limit: p.Limit, States: states, Locked: k, Paused: until}}, extra(p.Limit, k.Had))
	return err
}

// forget deletes the rows the call created when it writes none.
func forget[TTx any](ctx context.Context, d Dialect[TTx], tx TTx, l driver.Limit, k Locked) error {
	if len(k.Created) == 0 {
		return nil
	}
	_, err := d.Write(ctx, tx, nil, refs(l, k.Created))
	return err
}

// extra are the rows beyond l's Shards, which a reshard to fewer shards
// leaves over.
func extra(l driver.Limit, rows []driver.Row) []RowRef {
	var out []RowRef
	for _, r := range rows {
		if int(r.Shard) >= l.Shards {
			out = append(out, RowRef{driver.KeyRef{Name: l.Name, Key: l.Key}, r.Shard})
		}
	}
	return out
}

func refs(l driver.Limit, shards []int32) []RowRef {
	out := make([]RowRef, len(shards))
	for i, sh := range shards {
		out[i] = RowRef{driver.KeyRef{Name: l.Name, Key: l.Key}, sh}
	}
	return out
}

func row(shard int32, s algo.State) driver.Row {
	return driver.Row{Shard: shard, Value: s.Value, Prev: s.Prev, TS: time.UnixMicro(s.TS)}
}

// LockTimer adds up the time spent in the operations that take row locks,
// when On (driver.TakeParams.TimeLocks).
type LockTimer struct {
	On    bool
	Total time.Duration
}

// Start returns the instant a locking operation starts.
func (t *LockTimer) Start() time.Time {
	if !t.On {
		return time.Time{}
	}
	return time.Now()
}

// Stop adds the time since start.
func (t *LockTimer) Stop(start time.Time) {
	if t.On {
		t.Total += time.Since(start)
	}
}
