package pgproto

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// Take is driver.Store.Take. An unsharded limit is taken in one statement
// (takeInSQL). A sharded limit is first served from the first shard no other
// transaction holds (takeOneShard); when that shard lacks the tokens, a
// denial the committed state already decides is answered without a lock;
// otherwise every shard is locked, in shard order.
func (pr Protocol) Take(ctx context.Context, db DB, p driver.TakeParams) (driver.TakeResult, error) {
	lt := LockTimer{On: p.TimeLocks}
	if p.Shards == 1 && driver.InSQL(p) {
		res, done, err := takeInSQL(ctx, db, p, &lt)
		if err != nil || done {
			res.LockWait = lt.Total
			return res, err
		}
	}
	if driver.FitsOneShard(p) {
		res, done, err := takeOneShard(ctx, db, p, &lt)
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
		read, err := pr.Read(ctx, db, driver.ReadParams{Name: p.Name, Key: p.Key, Now: p.Now})
		if err != nil {
			return driver.TakeResult{}, err
		}
		if res := driver.Check(p, read); !res.Decision.OK {
			res.LockWait = lt.Total
			return res, nil
		}
	}
	lockStart := lt.Start()
	rows, at, err := lockShards(ctx, db, p.Limit, p.Now)
	if err == nil && len(rows) == 0 {
		if !driver.GrantsWhenFull(p) {
			// A missing key is full, the most a key can hold: when even
			// that does not grant (a reservation beyond its cap, or one
			// no wait could repay), nothing is created, so that a call
			// refused writes nothing, and the committed state decides.
			lt.Stop(lockStart)
			read, err := pr.Read(ctx, db, driver.ReadParams{Name: p.Name, Key: p.Key, Now: p.Now})
			res := driver.Check(p, read)
			res.LockWait = lt.Total
			return res, err
		}
		// The rows 0..Shards-1, created full and locked, first.
		if err = insertShards(ctx, db, p.Limit); err == nil {
			rows, at, err = lockShards(ctx, db, p.Limit, p.Now)
		}
	}
	lt.Stop(lockStart)
	if err != nil {
		return driver.TakeResult{}, err
	}
	res, write := driver.Decide(p, rows, at)
	if write {
		if err := pr.store(ctx, db, p.Limit, rows, res.States); err != nil {
			return driver.TakeResult{}, err
		}
	}
	res.LockWait = lt.Total
	return res, nil
}

// takeInSQL takes from an unsharded limit in one statement, which creates or
// locks the row, refills, decides and writes in SQL. done is false when the
// statement granted nothing (a denial, a stored value that is not finite,
// rows left by a sharded config): the row is then locked, and the caller
// takes its locked path, which decides with algo in Go, so that a denial
// costs one more round trip. Whichever path writes, the state is algo's
// (TestTakeRowMatchesAlgo).
func takeInSQL(ctx context.Context, db DB, p driver.TakeParams, lt *LockTimer) (driver.TakeResult, bool, error) {
	defer lt.Stop(lt.Start())
	next, clock, ok, err := TakeRow(ctx, db, p, false)
	if err != nil || !ok {
		return driver.TakeResult{}, false, err
	}
	return driver.TakeResult{Decision: driver.Granted(p.Config, next, clock.UnixMicro()), At: clock, States: []algo.State{next}}, true, nil
}

// TakeRow runs the one-statement take of p on shard 0: TakeBucket or
// TakeWindow by the limit's kind, TakeBucketReserve or TakeWindowReserve
// for a reservation. ok is false when it granted nothing: the statement
// returned no row (the row, when it exists, may then be locked, which the
// locked path that follows takes anyway), or the call would not be granted
// even on a full row (driver.Fresh), which grants the most any row can, and
// TakeRow sends nothing. With must the statement raises Denied instead of
// returning no row (TakeCommit), and a call a full row refuses sends Deny,
// which raises it.
func TakeRow(ctx context.Context, db pgdb.DBTX, p driver.TakeParams, must bool) (next algo.State, clock time.Time, ok bool, err error) {
	cfg, fullTS := p.Config, micros(p.Full().TS)
	fresh, freshOK := driver.Fresh(p)
	switch {
	case !freshOK && must:
		return algo.State{}, time.Time{}, false, queries.Deny(ctx, db)
	case !freshOK:
		return algo.State{}, time.Time{}, false, nil
	case must:
		db = mustDB{db}
	}
	window := cfg.Kind == algo.FixedWindow
	fitsAt := leastGranting(cfg, p.Count)
	var value float64
	var ts time.Time
	switch {
	case p.Reserve && window:
		var r pgdb.TakeWindowReserveRow
		r, err = queries.TakeWindowReserve(ctx, db, pgdb.TakeWindowReserveParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
			FitsAt: fitsAt, DebtAt: debtAt(cfg, p.Count),
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	case p.Reserve:
		var r pgdb.TakeBucketReserveRow
		r, err = queries.TakeBucketReserve(ctx, db, pgdb.TakeBucketReserveParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: float64(cfg.Period), Capacity: cfg.Capacity, Count: p.Count,
			FitsAt: fitsAt, DebtAt: debtAt(cfg, p.Count),
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	case window:
		var r pgdb.TakeWindowRow
		r, err = queries.TakeWindow(ctx, db, pgdb.TakeWindowParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count, FitsAt: fitsAt,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	default:
		var r pgdb.TakeBucketRow
		r, err = queries.TakeBucket(ctx, db, pgdb.TakeBucketParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: float64(cfg.Period), Capacity: cfg.Capacity, Count: p.Count, FitsAt: fitsAt,
		})
		value, ts, clock = r.Value, r.Ts, r.Clock
	}
	return TakenRow(value, ts, clock, err)
}

// leastGranting is the least value a row of c may refill to (algo.Project,
// before the cap) for a take of target tokens to leave no debt: algo's test
// for one shard, 0+min(refilled, Capacity)-target >= -tolerance, with
// algo's tolerance. The test only grows with the refilled value (each
// operation rounds monotonically), so a one-statement take compares the
// refilled value with this bound (fits_at, debt_at) in place of the
// operations, which PostgreSQL would build anew at every execution
// (TestTakeRowMatchesAlgo holds the two to algo). It is +Inf when no value
// passes, -Inf when every one does.
func leastGranting(c algo.Config, target float64) float64 {
	tol := 1e-9 * math.Max(1, c.Capacity)
	passes := func(refilled float64) bool { return 0+math.Min(refilled, c.Capacity)-target >= -tol }
	// Binary search over the float64 values in order: an int64 whose
	// order is theirs (negative values mirrored; -0 and +0 are both 0,
	// which the test cannot tell apart).
	order := func(f float64) int64 {
		b := math.Float64bits(f)
		if b>>63 == 1 {
			return -int64(b &^ (1 << 63))
		}
		return int64(b)
	}
	value := func(o int64) float64 {
		if o < 0 {
			return math.Float64frombits(uint64(-o) | 1<<63)
		}
		return math.Float64frombits(uint64(o))
	}
	lo, hi := order(math.Inf(-1)), order(math.Inf(1))
	switch {
	case passes(math.Inf(-1)):
		return math.Inf(-1)
	case !passes(math.Inf(1)):
		return math.Inf(1)
	}
	// passes(value(hi)) and not passes(value(lo)); hi-lo overflows an
	// int64, not a uint64.
	for uint64(hi)-uint64(lo) > 1 {
		mid := lo + int64((uint64(hi)-uint64(lo))/2)
		if passes(value(mid)) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return value(hi)
}

// debtAt is the least value a row of c may refill to for a reservation of
// count to stay within MaxReserved (algo.TakeShards' pooled-target test):
// -Inf when MaxReserved is 0, no cap.
func debtAt(c algo.Config, count float64) float64 {
	if c.MaxReserved == 0 {
		return math.Inf(-1)
	}
	return leastGranting(c, count-c.MaxReserved)
}

// TakenRow is the result of a one-row take (TakeRow, and pgstore's escrow
// debit) from what its statement returned: ok is false when it returned no
// row (pgx.ErrNoRows), which it does when it granted nothing.
func TakenRow(value float64, ts, clock time.Time, err error) (algo.State, time.Time, bool, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return algo.State{}, time.Time{}, false, nil
	case err != nil:
		return algo.State{}, time.Time{}, false, err
	}
	return algo.State{Value: value, TS: ts.UnixMicro()}, clock, true, nil
}

// tried is what a try-lock or a wait for one shard found.
type tried struct {
	row    driver.Row
	locked bool
	// top is the highest shard the key has (-1 for none), when the
	// statement read it; all is every row, with ReadAll.
	top int32
	all []driver.Row
	now time.Time
}

// takeOneShard is the fast path of a sharded limit: lock the first shard,
// going up from a random one, that no other transaction holds, and take from
// it alone when it has enough. The lock is taken inside a savepoint that is
// released (keeping the lock) when the shard grants, and rolled back
// (letting the lock go) when it does not; done is then false and the caller
// locks every shard. With ReadAll the other shards are read, as last
// committed, in the same statement; without it the result is Partial.
func takeOneShard(ctx context.Context, db DB, p driver.TakeParams, lt *LockTimer) (driver.TakeResult, bool, error) {
	start := int32(rand.IntN(p.Shards))
	lockStart := lt.Start()
	t, err := tryLockShard(ctx, db, p, start)
	if err == nil && !t.locked && t.top == int32(p.Shards-1) {
		// Every shard is held. Queue for one, the random first choice,
		// rather than for all of them: holding nothing of this key while
		// waiting for a single row cannot deadlock, and locking every
		// shard here would make each call that starts meanwhile find them
		// all busy too.
		all := t.all
		t, err = waitShard(ctx, db, p, start)
		t.all = all
	}
	lt.Stop(lockStart)
	if err != nil {
		// The savepoint may be open: the transaction has failed anyway,
		// and its rollback ends it.
		return driver.TakeResult{}, false, err
	}
	if t.locked && t.top == int32(p.Shards-1) {
		next, d := driver.DecideOne(p, t.row, t.now)
		if d.OK {
			err := Send(ctx, db, func(q pgdb.DBTX) error {
				return queries.WriteFastShard(ctx, q, pgdb.WriteFastShardParams{
					Name: p.Name, Key: p.Key, Shard: t.row.Shard, Value: next.Value, Prev: next.Prev, Ts: micros(next.TS)})
			}, Exec(ctx, release))
			if err != nil {
				return driver.TakeResult{}, false, err
			}
			res := driver.TakeResult{Decision: d, At: t.now, Partial: true}
			if p.ReadAll {
				res.States, _ = p.States(t.all, t.now.UnixMicro())
				res.States[t.row.Shard] = next
				res.Partial = false
			}
			return res, true, nil
		}
	}
	// The shard lacks the tokens, every row is missing, or the key has rows
	// of another Shards (top): let the shard go and lock every row.
	return driver.TakeResult{}, false, Send(ctx, db, Exec(ctx, rollback), Exec(ctx, release))
}

// tryLockShard opens the savepoint and runs TryLockShard (with p.ReadAll,
// TryLockShardAndRead) from shard start, in one round trip. When no row is
// free or none exists, locked is false and top is p.Shards-1 (without
// ReadAll: which of the two is unknown).
func tryLockShard(ctx context.Context, db DB, p driver.TakeParams, start int32) (tried, error) {
	var out tried
	lock := func(q pgdb.DBTX) error {
		r, err := queries.TryLockShard(ctx, q, pgdb.TryLockShardParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Every row is held or missing; which of the two is unknown,
			// so say every shard may exist.
			out = tried{top: int32(p.Shards - 1)}
			return nil
		case err != nil:
			return err
		}
		out = tried{row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, locked: true, top: r.TopShard, now: r.Clock}
		return nil
	}
	if p.ReadAll {
		lock = func(q pgdb.DBTX) error {
			rows, err := queries.TryLockShardAndRead(ctx, q, pgdb.TryLockShardAndReadParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
			out = tried{top: -1}
			for _, r := range rows {
				out.now = r.Clock
				if r.Shard != nil {
					out.all = append(out.all, driver.Row{Shard: *r.Shard, Value: *r.Value, Prev: *r.Prev, TS: *r.Ts})
					out.top = max(out.top, *r.Shard)
				}
				if r.LockedShard != nil {
					out.row = driver.Row{Shard: *r.LockedShard, Value: *r.LockedValue, Prev: *r.LockedPrev, TS: *r.LockedTs}
					out.locked = true
				}
			}
			return err
		}
	}
	err := Send(ctx, db, Exec(ctx, savepoint), lock)
	return out, err
}

// waitShard runs WaitShard, inside the open savepoint. A missing row gives
// tried{top: -1}.
func waitShard(ctx context.Context, db DB, p driver.TakeParams, shard int32) (tried, error) {
	r, err := queries.WaitShard(ctx, db, pgdb.WaitShardParams{Name: p.Name, Key: p.Key, Shard: shard, Now: p.Now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return tried{top: -1}, nil
	case err != nil:
		return tried{}, err
	}
	return tried{row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}, locked: true, top: r.TopShard, now: r.Clock}, nil
}

// lockShards runs LockShards: every row of l's key, locked, and the latest
// of the clocks read before each row's lock was taken, the nearest to
// holding them all.
func lockShards(ctx context.Context, db DB, l driver.Limit, now *time.Time) ([]driver.Row, time.Time, error) {
	rows, err := queries.LockShards(ctx, db, pgdb.LockShardsParams{Name: l.Name, Key: l.Key, Now: now})
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]driver.Row, len(rows))
	var at time.Time
	for i, r := range rows {
		out[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}
		if r.Clock.After(at) {
			at = r.Clock
		}
	}
	if len(rows) == 0 && now != nil {
		// Nothing to decide on; the injected clock, for the record.
		at = *now
	}
	return out, at, nil
}

// insertShards runs InsertShards for l, its rows full.
func insertShards(ctx context.Context, db DB, l driver.Limit) error {
	full := l.Full()
	return queries.InsertShards(ctx, db, pgdb.InsertShardsParams{
		Name: l.Name, Key: l.Key, Shards: int32(l.Shards), Value: full.Value, Ts: micros(full.TS),
	})
}

// store writes states to the rows 0..Shards-1 of l's key, whose rows (all
// of them, held by the transaction) were had; a reshard to more shards
// creates the missing rows first, and one to fewer deletes the extra ones
// with the write.
func (pr Protocol) store(ctx context.Context, db DB, l driver.Limit, had []driver.Row, states []algo.State) error {
	if len(had) < l.Shards {
		if err := insertShards(ctx, db, l); err != nil {
			return err
		}
	}
	var doomed []rowRef
	for _, shard := range driver.Extra(had, l.Shards) {
		doomed = append(doomed, rowRef{name: l.Name, key: l.Key, shard: shard})
	}
	return pr.write(ctx, db, []keyWrite{{name: l.Name, key: l.Key, states: states}}, doomed)
}

// Read is driver.Store.Read: ReadShards, the committed rows of (name, key)
// and the clock, locking nothing.
func (Protocol) Read(ctx context.Context, db pgdb.DBTX, p driver.ReadParams) (driver.ReadResult, error) {
	rows, err := queries.ReadShards(ctx, db, pgdb.ReadShardsParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return driver.ReadResult{}, err
	}
	var out driver.ReadResult
	for _, r := range rows {
		out.At = r.Clock
		if r.Shard != nil {
			out.Rows = append(out.Rows, driver.Row{Shard: *r.Shard, Value: *r.Value, Prev: *r.Prev, TS: *r.Ts})
		}
	}
	return out, nil
}

// Credit is driver.Store.Credit. A key with no row is full: there is nothing
// to give back to it.
func (pr Protocol) Credit(ctx context.Context, db DB, p driver.CreditParams) error {
	rows, at, err := lockShards(ctx, db, p.Limit, p.Now)
	if err != nil || len(rows) == 0 {
		return err
	}
	return pr.store(ctx, db, p.Limit, rows, driver.CreditStates(p, rows, at))
}

// Reset is driver.Store.Reset, but for escrow: it deletes the rows of
// (Name, Key).
func (Protocol) Reset(ctx context.Context, db DB, p driver.ResetParams) error {
	return queries.DeleteKey(ctx, db, pgdb.DeleteKeyParams{Name: p.Name, Key: p.Key})
}
