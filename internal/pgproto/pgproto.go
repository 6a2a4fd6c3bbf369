// Package pgproto is the PostgreSQL protocol of txlimit's stores, shared by
// pgstore (pgx) and pgsqlstore (database/sql): which statements of
// queries/postgres an operation runs, in which order, with which locks and
// savepoints, and what it decides from the rows it holds (package driver).
//
// A store supplies a Conn: each of those statements bound by the store's
// own sqlc-generated code for its transaction type. Statements that a store
// able to pipeline sends in one round trip (pgx's batches) are one method of
// Conn, so that the protocol costs no more round trips than the driver
// needs: with database/sql, whose drivers send one statement at a time, such
// a method costs one round trip per statement.
package pgproto

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
)

// The savepoint of the sharded fast path (Take): opened before a shard is
// try-locked, released when that shard grants (keeping its lock), rolled
// back and released when it does not (letting the lock go).
const (
	Savepoint = "SAVEPOINT txlimit_try"
	Release   = "RELEASE SAVEPOINT txlimit_try"
	Rollback  = "ROLLBACK TO SAVEPOINT txlimit_try"
	// DropSavepoint rolls back to the savepoint and releases it: two
	// statements without parameters, which every driver can send in one
	// simple-protocol query.
	DropSavepoint = Rollback + "; " + Release
)

// Conn runs the statements of queries/postgres in a transaction of type TTx.
// Each method is one round trip for a store that can pipeline; it returns
// the database's error as the driver returned it.
type Conn[TTx any] interface {
	// TryLockShard opens the savepoint and runs TryLockShard (with
	// p.ReadAll, TryLockShardAndRead) from shard start. When no row is
	// free or none exists, Locked is false and Top is p.Shards-1 (without
	// ReadAll: which of the two is unknown).
	TryLockShard(ctx context.Context, tx TTx, p driver.TakeParams, start int32) (Tried, error)
	// WaitShard runs WaitShard, inside the open savepoint. A missing row
	// gives Tried{Top: -1}.
	WaitShard(ctx context.Context, tx TTx, p driver.TakeParams, shard int32) (Tried, error)
	// KeepShard runs WriteShard for one row and releases the savepoint.
	KeepShard(ctx context.Context, tx TTx, w RowWrite) error
	// DropShard rolls back to the savepoint and releases it.
	DropShard(ctx context.Context, tx TTx) error

	// TakeRow runs one admitted call on shard 0 in one statement:
	// TakeBucket or TakeWindow by the limit's kind, TakeRow for a
	// reservation. ok is false when it returned no row (granted nothing):
	// the row, when it exists, may then be locked, which the locked path
	// that follows takes anyway.
	TakeRow(ctx context.Context, tx TTx, p driver.TakeParams) (next algo.State, clock time.Time, ok bool, err error)
	// ReadShards runs ReadShards.
	ReadShards(ctx context.Context, tx TTx, name, key string, now *time.Time) (driver.ReadResult, error)
	// LockShards runs LockShards.
	LockShards(ctx context.Context, tx TTx, name, key string, now *time.Time) ([]ClockedRow, error)
	// InsertShards runs InsertShards for l, its rows full.
	InsertShards(ctx context.Context, tx TTx, l driver.Limit) error
	// Write stores every KeyWrite (WriteShard for one state, WriteKeyShards
	// for several) and deletes the rows of doomed (DeleteShards).
	Write(ctx context.Context, tx TTx, writes []KeyWrite, doomed []RowRef) error
	// DeleteKey runs DeleteKey.
	DeleteKey(ctx context.Context, tx TTx, name, key string) error

	// InsertAndLockKeys runs InsertKeys and LockKeys for keys, which are in
	// the canonical order, and returns the rows InsertKeys created and every
	// row LockKeys returned, in its order.
	InsertAndLockKeys(ctx context.Context, tx TTx, keys []KeyInsert, now *time.Time) (created []RowRef, rows []KeyRow, err error)

	// ScanKeys runs ScanKeys.
	ScanKeys(ctx context.Context, tx TTx, after driver.KeyRef, max int) ([]driver.KeyRef, error)
	// LockIdle runs LockIdle.
	LockIdle(ctx context.Context, tx TTx, keys []driver.KeyRef, now *time.Time) ([]IdleRow, error)
	// DeleteShards runs DeleteShards and returns how many rows it deleted.
	DeleteShards(ctx context.Context, tx TTx, rows []RowRef) (int64, error)
}

// Tried is what TryLockShard or WaitShard found.
type Tried struct {
	Row    driver.Row
	Locked bool
	// Top is the highest shard the key has (-1 for none), when the
	// statement read it; All is every row, with ReadAll.
	Top int32
	All []driver.Row
	Now time.Time
}

// ClockedRow is a row with the clock read before its lock was taken.
type ClockedRow struct {
	driver.Row
	Clock time.Time
}

// KeyRow is a row of one of several keys, with the clock.
type KeyRow struct {
	Name, Key string
	driver.Row
	Clock time.Time
}

// IdleRow is a row LockIdle locked, with the number of rows its key has.
type IdleRow struct {
	Name, Key string
	driver.Row
	Total int64
	Clock time.Time
}

// RowRef names one row.
type RowRef struct {
	Name, Key string
	Shard     int32
}

// RowWrite is the new state of one row.
type RowWrite struct {
	Name, Key string
	Shard     int32
	State     algo.State
}

// KeyWrite is the new state of the rows 0..len(States)-1 of a key.
type KeyWrite struct {
	Name, Key string
	States    []algo.State
}

// KeyInsert is one key of InsertKeys: its rows 0..Shards-1, created as Full.
type KeyInsert struct {
	Name, Key string
	Shards    int32
	Full      algo.State
}

// LockTimer adds up the time spent in statements that take row locks, when
// On (TimeLocks).
type LockTimer struct {
	On    bool
	Total time.Duration
}

// Start returns the instant a locking statement starts.
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

// Take is driver.Store.Take. A sharded limit is first served from the first
// shard no other transaction holds (takeOneShard); when that shard lacks the
// tokens, a denial the committed state already decides is answered without
// a lock; otherwise every shard is locked, in shard order.
func Take[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.TakeParams) (driver.TakeResult, error) {
	lt := LockTimer{On: p.TimeLocks}
	if p.Shards == 1 && driver.InSQL(p) {
		res, done, err := takeInSQL(ctx, c, tx, p, &lt)
		if err != nil || done {
			res.LockWait = lt.Total
			return res, err
		}
	}
	if driver.FitsOneShard(p) {
		res, done, err := takeOneShard(ctx, c, tx, p, &lt)
		if err != nil || done {
			res.LockWait = lt.Total
			return res, err
		}
	}
	if p.Shards > 1 && !p.Reserve {
		// Before queueing on every shard, see whether the committed state
		// already rules the request out. Concurrent transactions can only
		// lower it further (a concurrent Credit or Reset is ordered after
		// this call), so such a denial is right without any lock.
		read, err := c.ReadShards(ctx, tx, p.Name, p.Key, p.Now)
		if err != nil {
			return driver.TakeResult{}, err
		}
		states, _ := p.States(read.Rows, read.At.UnixMicro())
		if _, d := algo.TakeShards(p.Shard(p.Shards), states, read.At.UnixMicro(), p.Count, false); !d.OK {
			return driver.TakeResult{Decision: d, At: read.At, States: states, LockWait: lt.Total}, nil
		}
	}
	rows, at, err := lockKey(ctx, c, tx, p.Limit, p.Now, &lt)
	if err != nil {
		return driver.TakeResult{}, err
	}
	next, d, write := driver.Decide(p, rows, at)
	if write {
		if err := store(ctx, c, tx, p.Limit, rows, next); err != nil {
			return driver.TakeResult{}, err
		}
	}
	return driver.TakeResult{Decision: d, At: at, States: next, LockWait: lt.Total}, nil
}

// takeInSQL takes from an unsharded limit in one statement, TakeRow, which
// creates or locks the row, refills, decides and writes in SQL. done is false
// when the statement granted nothing (a denial, a stored value that is not
// finite, rows left by a sharded config): the row is then locked, and the
// caller takes its locked path, which decides with algo in Go, so that a
// denial costs one more round trip. Whichever path writes, the state is
// algo's (TestTakeRowMatchesAlgo in each store).
func takeInSQL[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.TakeParams, lt *LockTimer) (driver.TakeResult, bool, error) {
	defer lt.Stop(lt.Start())
	next, clock, ok, err := c.TakeRow(ctx, tx, p)
	if err != nil || !ok {
		return driver.TakeResult{}, false, err
	}
	return driver.TakeResult{Decision: driver.Granted(p.Config, next, clock.UnixMicro()), At: clock, States: []algo.State{next}}, true, nil
}

// takeOneShard is the fast path of a sharded limit: lock the first shard,
// going up from a random one, that no other transaction holds, and take from
// it alone when it has enough. The lock is taken inside a savepoint that is
// released (keeping the lock) when the shard grants, and rolled back
// (letting the lock go) when it does not; done is then false and the caller
// locks every shard. With ReadAll the other shards are read, as last
// committed, in the same statement; without it the result is Partial.
func takeOneShard[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.TakeParams, lt *LockTimer) (driver.TakeResult, bool, error) {
	start := int32(rand.IntN(p.Shards))
	lockStart := lt.Start()
	tried, err := c.TryLockShard(ctx, tx, p, start)
	if err == nil && !tried.Locked && tried.Top == int32(p.Shards-1) {
		// Every shard is held. Queue for one, the random first choice,
		// rather than for all of them: holding nothing of this key while
		// waiting for a single row cannot deadlock, and locking every
		// shard here would make each call that starts meanwhile find them
		// all busy too.
		all := tried.All
		tried, err = c.WaitShard(ctx, tx, p, start)
		tried.All = all
	}
	lt.Stop(lockStart)
	if err != nil {
		// The savepoint may be open: the transaction has failed anyway,
		// and its rollback ends it.
		return driver.TakeResult{}, false, err
	}
	if tried.Locked && tried.Top == int32(p.Shards-1) {
		next, d := driver.DecideOne(p, tried.Row, tried.Now)
		if d.OK {
			if err := c.KeepShard(ctx, tx, RowWrite{Name: p.Name, Key: p.Key, Shard: tried.Row.Shard, State: next}); err != nil {
				return driver.TakeResult{}, false, err
			}
			res := driver.TakeResult{Decision: d, At: tried.Now, Partial: true}
			if p.ReadAll {
				res.States, _ = p.States(tried.All, tried.Now.UnixMicro())
				res.States[tried.Row.Shard] = next
				res.Partial = false
			}
			return res, true, nil
		}
	}
	// The shard lacks the tokens, every row is missing, or the key has rows
	// of another Shards (Top): let the shard go and lock every row.
	return driver.TakeResult{}, false, c.DropShard(ctx, tx)
}

// lockKey locks every row of l's key, waiting, in shard order, and returns
// them with the clock read once they are held. A key with no row gets rows
// 0..Shards-1, created full and locked, first.
func lockKey[TTx any](ctx context.Context, c Conn[TTx], tx TTx, l driver.Limit, now *time.Time, lt *LockTimer) ([]driver.Row, time.Time, error) {
	defer lt.Stop(lt.Start())
	rows, at, err := lockShards(ctx, c, tx, l, now)
	if err != nil || len(rows) > 0 {
		return rows, at, err
	}
	if err := c.InsertShards(ctx, tx, l); err != nil {
		return nil, time.Time{}, err
	}
	return lockShards(ctx, c, tx, l, now)
}

func lockShards[TTx any](ctx context.Context, c Conn[TTx], tx TTx, l driver.Limit, now *time.Time) ([]driver.Row, time.Time, error) {
	rows, err := c.LockShards(ctx, tx, l.Name, l.Key, now)
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]driver.Row, len(rows))
	var at time.Time
	for i, r := range rows {
		out[i] = r.Row
		if r.Clock.After(at) {
			at = r.Clock // read before each row's lock: the latest is nearest to holding them all
		}
	}
	if len(rows) == 0 && now != nil {
		// Nothing to decide on; the injected clock, for the record.
		at = *now
	}
	return out, at, nil
}

// store writes states to the rows 0..Shards-1 of l's key, whose rows (all
// of them, held by tx) were had; a reshard to more shards creates the
// missing rows first, and one to fewer deletes the extra ones with the
// write.
func store[TTx any](ctx context.Context, c Conn[TTx], tx TTx, l driver.Limit, had []driver.Row, states []algo.State) error {
	if len(had) < l.Shards {
		if err := c.InsertShards(ctx, tx, l); err != nil {
			return err
		}
	}
	var doomed []RowRef
	for _, shard := range driver.Extra(had, l.Shards) {
		doomed = append(doomed, RowRef{Name: l.Name, Key: l.Key, Shard: shard})
	}
	return c.Write(ctx, tx, []KeyWrite{{Name: l.Name, Key: l.Key, States: states}}, doomed)
}

// Read is driver.Store.Read.
func Read[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.ReadParams) (driver.ReadResult, error) {
	return c.ReadShards(ctx, tx, p.Name, p.Key, p.Now)
}

// Credit is driver.Store.Credit. A key with no row is full: there is nothing
// to give back to it.
func Credit[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.CreditParams) error {
	rows, at, err := lockShards(ctx, c, tx, p.Limit, p.Now)
	if err != nil || len(rows) == 0 {
		return err
	}
	return store(ctx, c, tx, p.Limit, rows, driver.CreditStates(p, rows, at))
}

// Delete is driver.Store.Delete.
func Delete[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.KeyParams) error {
	return c.DeleteKey(ctx, tx, p.Name, p.Key)
}

// TakeAll is driver.Store.TakeAll: the insert that takes the locks in the
// canonical order and the read of the locked rows (one round trip for a
// store that pipelines), then the writes (or, for a denial, the removal of
// the rows the insert created).
func TakeAll[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	n := len(p.Takes)
	keys := make([]KeyInsert, n)
	index := make(map[driver.KeyRef]int, n)
	for i, j := range driver.CanonicalOrder(p.Takes) {
		t := p.Takes[j]
		keys[i] = KeyInsert{Name: t.Name, Key: t.Key, Shards: int32(t.Shards), Full: t.Full()}
		index[driver.KeyRef{Name: t.Name, Key: t.Key}] = j
	}
	lt := LockTimer{On: p.TimeLocks}
	lockStart := lt.Start()
	createdRows, locked, err := c.InsertAndLockKeys(ctx, tx, keys, p.Now)
	lt.Stop(lockStart)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	created := make(map[driver.KeyRef][]int32)
	for _, r := range createdRows {
		k := driver.KeyRef{Name: r.Name, Key: r.Key}
		created[k] = append(created[k], r.Shard)
	}
	// had holds each key's rows as they were before InsertKeys: the rows
	// it created are full placeholders, which a reshard must not count.
	had := make([][]driver.Row, n)
	all := make([][]driver.Row, n)
	var at time.Time
	for _, r := range locked {
		k := driver.KeyRef{Name: r.Name, Key: r.Key}
		i := index[k]
		all[i] = append(all[i], r.Row)
		if !containsShard(created[k], r.Shard) {
			had[i] = append(had[i], r.Row)
		}
		if at.IsZero() {
			at = r.Clock // clock_timestamp() is read per row, after every lock is held
		}
	}
	out, writes := driver.DecideAll(p, had, at)
	out.LockWait = lt.Total
	var kw []KeyWrite
	var doomed []RowRef
	for i, t := range p.Takes {
		if writes[i] == nil {
			// A denied limit keeps its rows as they were: those
			// InsertKeys created (full, so equal to no row) go again.
			for _, sh := range created[driver.KeyRef{Name: t.Name, Key: t.Key}] {
				doomed = append(doomed, RowRef{Name: t.Name, Key: t.Key, Shard: sh})
			}
			continue
		}
		kw = append(kw, KeyWrite{Name: t.Name, Key: t.Key, States: out.Results[i].States})
		for _, sh := range driver.Extra(all[i], t.Shards) {
			doomed = append(doomed, RowRef{Name: t.Name, Key: t.Key, Shard: sh})
		}
	}
	if len(kw) > 0 || len(doomed) > 0 {
		if err := c.Write(ctx, tx, kw, doomed); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	return out, nil
}

func containsShard(shards []int32, shard int32) bool {
	for _, s := range shards {
		if s == shard {
			return true
		}
	}
	return false
}

// Prune is driver.Store.Prune. The rows are locked with FOR UPDATE SKIP
// LOCKED, so a batch never waits for a row that live traffic holds: a key
// with a row held elsewhere is left for a later run.
func Prune[TTx any](ctx context.Context, c Conn[TTx], tx TTx, p driver.PruneParams) (driver.PruneResult, error) {
	keys, err := c.ScanKeys(ctx, tx, p.After, p.Max)
	if err != nil || len(keys) == 0 {
		return driver.PruneResult{}, err
	}
	out := driver.PruneResult{Keys: len(keys), Last: keys[len(keys)-1]}
	var known []driver.KeyRef
	for _, k := range keys {
		if !p.Known(k.Name) {
			out.Unknown++
			continue
		}
		known = append(known, k)
	}
	if len(known) == 0 {
		return out, nil
	}
	rows, err := c.LockIdle(ctx, tx, known, p.Now)
	if err != nil {
		return driver.PruneResult{}, err
	}
	// clock_timestamp() is read per row. Judging every row at the earliest
	// reading is safe: a row full then is full later.
	var at time.Time
	for _, r := range rows {
		if at.IsZero() || r.Clock.Before(at) {
			at = r.Clock
		}
	}
	var doomed []RowRef
	for i := 0; i < len(rows); {
		j := i
		var keyRows []driver.Row
		for ; j < len(rows) && rows[j].Name == rows[i].Name && rows[j].Key == rows[i].Key; j++ {
			keyRows = append(keyRows, rows[j].Row)
		}
		// Delete a key only when this transaction holds every row of it.
		if int64(len(keyRows)) == rows[i].Total && p.Full(rows[i].Name, rows[i].Key, keyRows, at) {
			for _, r := range keyRows {
				doomed = append(doomed, RowRef{Name: rows[i].Name, Key: rows[i].Key, Shard: r.Shard})
			}
		}
		i = j
	}
	if len(doomed) > 0 {
		n, err := c.DeleteShards(ctx, tx, doomed)
		if err != nil {
			return driver.PruneResult{}, err
		}
		out.Deleted = int(n)
	}
	return out, nil
}

// TakenRow is the result of a one-row take (Conn.TakeRow, and pgstore's
// escrow debit) from what its statement returned: ok is false when it
// returned no row (noRow: the driver's no-rows error), which it does when it
// granted nothing.
func TakenRow(value float64, ts, clock time.Time, noRow bool, err error) (algo.State, time.Time, bool, error) {
	switch {
	case noRow:
		return algo.State{}, time.Time{}, false, nil
	case err != nil:
		return algo.State{}, time.Time{}, false, err
	}
	return algo.State{Value: value, TS: ts.UnixMicro()}, clock, true, nil
}
