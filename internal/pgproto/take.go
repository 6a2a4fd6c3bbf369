package pgproto

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/pgdb"
)

// Take is driver.Ops.Take (engine.Take on PostgreSQL's row operations).
func (pr Protocol) Take(ctx context.Context, db DB, p driver.TakeParams) (driver.TakeResult, error) {
	return engine.Take[DB](ctx, dialect(pr), db, p)
}

// TakeAll is driver.Ops.TakeAll.
func (pr Protocol) TakeAll(ctx context.Context, db DB, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return dialect(pr).TakeAll(ctx, db, p)
}

// TakeAll makes the dialect engine.Rates too: the rate limits an acquire
// takes with its slots.
func (d dialect) TakeAll(ctx context.Context, db DB, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return engine.TakeAll[DB](ctx, d, db, p)
}

// Prune is one batch of driver.Ops.Prune in db.
func (pr Protocol) Prune(ctx context.Context, db DB, p driver.PruneParams) (driver.PruneResult, error) {
	return engine.Prune[DB](ctx, dialect(pr), db, p)
}

// dialect is PostgreSQL's engine.Dialect: a SkipLocker and a Releaser,
// whose TryShard locks in a savepoint that KeepShards releases (keeping the
// lock) and LetGo rolls back (letting it go).
type dialect Protocol

var (
	_ engine.SkipLocker[DB] = dialect{}
	_ engine.Releaser[DB]   = dialect{}
)

// TakeRow is TakeRow without must.
func (dialect) TakeRow(ctx context.Context, db DB, p driver.TakeParams) (driver.TakeResult, bool, error) {
	next, clock, ok, err := TakeRow(ctx, db, p, false)
	if err != nil || !ok {
		return driver.TakeResult{}, false, err
	}
	return engine.Granted(p, next, clock), true, nil
}

// LockKey runs LockShards and, for a key without rows, InsertShards and
// LockShards again when create is set.
func (dialect) LockKey(ctx context.Context, db DB, l driver.Limit, now *time.Time, create bool) (engine.Locked, error) {
	rows, at, err := lockShards(ctx, db, l, now)
	if err == nil && len(rows) == 0 {
		if !create {
			return engine.Locked{None: true}, nil
		}
		if err = insertShards(ctx, db, l); err == nil {
			rows, at, err = lockShards(ctx, db, l, now)
		}
	}
	return engine.Locked{Had: rows, At: at}, err
}

// TryShard opens the savepoint and locks the first free shard going up from
// order[0] (tryLockShard). When every shard is held it queues for
// order[0], the random first choice, rather than for all of them: holding
// nothing of this key while waiting for a single row cannot deadlock, and
// locking every shard here would make each call that starts meanwhile find
// them all busy too.
func (dialect) TryShard(ctx context.Context, db DB, p driver.TakeParams, order []int32) (engine.Tried, error) {
	t, err := tryLockShard(ctx, db, p, order[0])
	if err == nil && !t.locked && t.top == int32(p.Shards-1) {
		all := t.all
		t, err = waitShard(ctx, db, p, order[0])
		t.all = all
	}
	return engine.Tried{Row: t.row, Locked: t.locked, Top: t.top, All: t.all, Now: t.now}, err
}

// KeepShards writes rows (WriteFastShard: shards of the layout they have)
// and releases the savepoint, keeping the locks, in one round trip.
func (dialect) KeepShards(ctx context.Context, db DB, l driver.Limit, rows []driver.Row) error {
	calls := make([]Call, 0, len(rows)+1)
	for _, r := range rows {
		calls = append(calls, func(q pgdb.DBTX) error {
			return queries.WriteFastShard(ctx, q, pgdb.WriteFastShardParams{
				Name: l.Name, Key: l.Key, Shard: r.Shard, Value: r.Value, Prev: r.Prev, Ts: r.TS})
		})
	}
	return Send(ctx, db, append(calls, Exec(ctx, release))...)
}

// LetGo rolls back to the savepoint and releases it, in one round trip.
func (dialect) LetGo(ctx context.Context, db DB) error {
	return Send(ctx, db, Exec(ctx, rollback), Exec(ctx, release))
}

// TakeRow runs the one-statement take of p on shard 0 (TakeBucket,
// TakeWindow, or their Reserve forms). ok is false when it granted nothing:
// the statement returned no row (the row may then be locked, which the
// locked path that follows takes anyway), or even a full row, which grants
// the most any row can, would not grant it (driver.Fresh), and nothing was
// sent. With must the statement raises Denied instead of returning no row
// (TakeCommit), and a call a full row refuses sends Deny, which raises it.
func TakeRow(ctx context.Context, db pgdb.DBTX, p driver.TakeParams, must bool) (next algo.State, clock time.Time, ok bool, err error) {
	cfg, fullTS := p.Config, time.UnixMicro(p.Full().TS)
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
	var r pgdb.TakeBucketRow
	switch {
	case p.Reserve && window:
		r, err = bucketRow(queries.TakeWindowReserve(ctx, db, pgdb.TakeWindowReserveParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count,
			FitsAt: fitsAt, DebtAt: debtAt(cfg, p.Count),
		}))
	case p.Reserve:
		r, err = bucketRow(queries.TakeBucketReserve(ctx, db, pgdb.TakeBucketReserveParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: float64(cfg.Period), Capacity: cfg.Capacity, Count: p.Count,
			FitsAt: fitsAt, DebtAt: debtAt(cfg, p.Count),
		}))
	case window:
		r, err = bucketRow(queries.TakeWindow(ctx, db, pgdb.TakeWindowParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: cfg.Period, Capacity: cfg.Capacity, Count: p.Count, FitsAt: fitsAt,
		}))
	default:
		r, err = queries.TakeBucket(ctx, db, pgdb.TakeBucketParams{
			Name: p.Name, Key: p.Key, FreshValue: fresh.Value, FullTs: fullTS, Now: p.Now,
			Rate: cfg.Rate, Period: float64(cfg.Period), Capacity: cfg.Capacity, Count: p.Count, FitsAt: fitsAt,
		})
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return algo.State{}, time.Time{}, false, nil
	case err != nil:
		return algo.State{}, time.Time{}, false, err
	}
	return algo.State{Value: r.Value, TS: r.Ts.UnixMicro()}, r.Clock, true, nil
}

// bucketRow is the row another one-statement take returned, as TakeBucket's
// (the four return the same columns).
func bucketRow[R pgdb.TakeWindowRow | pgdb.TakeBucketReserveRow | pgdb.TakeWindowReserveRow](r R, err error) (pgdb.TakeBucketRow, error) {
	return pgdb.TakeBucketRow(r), err
}

// leastGranting is the least value a row of c may refill to (algo.Project,
// before the cap) for a take of target tokens to leave no debt: algo's test
// for one shard, 0+min(refilled, Capacity)-target >= -tolerance. The test
// only grows with the refilled value (each operation rounds monotonically),
// so a one-statement take compares the refilled value with this bound
// (fits_at, debt_at) in place of the operations, which PostgreSQL would
// build anew at every execution. It is +Inf when no value passes, -Inf when
// every one does.
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
		out = tried{row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, locked: true, top: r.TopShard, now: r.Clock}
		return nil
	}
	if p.ReadAll {
		lock = func(q pgdb.DBTX) error {
			rows, err := queries.TryLockShardAndRead(ctx, q, pgdb.TryLockShardAndReadParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
			out = tried{top: -1}
			for _, r := range rows {
				out.now = r.Clock
				if r.Shard != nil {
					out.all = append(out.all, driver.Row{Shard: *r.Shard, Value: *r.Value, Prev: *r.Prev, TS: *r.Ts, Paused: paused(r.PausedUntil)})
					out.top = max(out.top, *r.Shard)
				}
				if r.LockedShard != nil {
					out.row = driver.Row{Shard: *r.LockedShard, Value: *r.LockedValue, Prev: *r.LockedPrev, TS: *r.LockedTs, Paused: paused(r.LockedPausedUntil)}
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
	return tried{row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}, locked: true, top: r.TopShard, now: r.Clock}, nil
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
		out[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: paused(r.PausedUntil)}
		if r.Clock.After(at) {
			at = r.Clock
		}
	}
	return out, at, nil
}

// paused is the pause of a row read with its paused_until.
func paused(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// pausedArg is paused_until for a pause, NULL for the zero time.
func pausedArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// insertShards runs InsertShards for l, its rows full.
func insertShards(ctx context.Context, db DB, l driver.Limit) error {
	full := l.Full()
	return queries.InsertShards(ctx, db, pgdb.InsertShardsParams{
		Name: l.Name, Key: l.Key, Shards: int32(l.Shards), Value: full.Value, Ts: time.UnixMicro(full.TS),
	})
}

// Read is driver.Ops.Read: ReadShards, the committed rows of (name, key)
// and the clock, locking nothing.
func (dialect) Read(ctx context.Context, db DB, p driver.ReadParams) (driver.ReadResult, error) {
	rows, err := queries.ReadShards(ctx, db, pgdb.ReadShardsParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return driver.ReadResult{}, err
	}
	var out driver.ReadResult
	for _, r := range rows {
		out.At = r.Clock
		if r.Shard != nil {
			out.Rows = append(out.Rows, driver.Row{Shard: *r.Shard, Value: *r.Value, Prev: *r.Prev, TS: *r.Ts, Paused: paused(r.PausedUntil)})
		}
	}
	return out, nil
}
