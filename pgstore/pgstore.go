// Package pgstore is the PostgreSQL store of txlimit, on pgx v5.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
//
// The limiter's TTx is then pgx.Tx, and LimitTx takes the transaction the
// application already has open. Rows are locked and written in that
// transaction, so they stay locked until it ends. An admitted call on an
// unsharded limit is one statement, INSERT … ON CONFLICT DO UPDATE … WHERE
// <fits> RETURNING, that creates or locks the row, refills it to the server's
// clock, decides and writes, with algo's arithmetic (a differential test holds
// it to algo); when it grants nothing, the row is read with SELECT … FOR
// UPDATE and decided on in Go. A sharded limit takes the first shard that no
// other transaction holds (FOR UPDATE SKIP LOCKED, inside a savepoint that
// the same call releases or rolls back). PostgreSQL 14 or later: the
// statement relies on extract(epoch …) of a timestamptz being an exact
// numeric.
//
// A limit with Config.Escrow (docs/escrow.md) is taken differently: a claim
// row in the caller's transaction, and the debit in a short transaction of
// the store's own on pool, so the limit's row is locked for one statement
// only. Escrow needs the pool, with connections to spare beyond those the
// callers' transactions hold, and the tables of migration 00002.
//
// # Poolers and exec modes
//
// The store keeps no session state and relies on no prepared statement
// surviving a transaction, but pgx's default exec mode
// (QueryExecModeCacheStatement) prepares statements on the connection it
// thinks it has. Behind PgBouncer (or another pooler) in transaction mode,
// consecutive transactions run on different server connections, and that
// mode fails on a share of them with SQLSTATE 42P05 (prepared statement
// already exists) or 26000 (prepared statement does not exist). Set
// pgx.ConnConfig.DefaultQueryExecMode to QueryExecModeExec (or
// QueryExecModeSimpleProtocol) for such pools; the store's errors for those
// two SQLSTATEs say so. Direct connections and session-mode poolers work in
// every mode.
//
// # Errors
//
// Database errors keep the *pgconn.PgError that carries the SQLSTATE
// (errors.As reaches it). A missing or outdated txlimit table matches
// txlimit.ErrNotMigrated. Under REPEATABLE READ or SERIALIZABLE, a concurrent
// update of the same limit surfaces as a serialization failure (40001), which
// is retryable: roll back and run the whole transaction again (Retryable
// classifies it).
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/pgstore/internal/db"
)

// Store is txlimit's store for pgx.
type Store struct {
	pool    *pgxpool.Pool
	queries *db.Queries
}

var _ driver.Store[pgx.Tx] = (*Store)(nil)

// New returns a store on pool. pool may be nil when only the …Tx forms of
// the limiter are used; the other forms then return txlimit.ErrNoPool.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, queries: db.New()}
}

// InTx implements driver.Store.
func (s *Store) InTx(ctx context.Context, readOnly bool, fn func(tx pgx.Tx) error) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	opts := pgx.TxOptions{}
	if readOnly {
		opts.AccessMode = pgx.ReadOnly
	}
	return mapErr(pgx.BeginTxFunc(ctx, s.pool, opts, fn))
}

// Ping implements driver.Store.
func (s *Store) Ping(ctx context.Context) error {
	if s.pool == nil {
		return driver.ErrNoPool
	}
	return mapErr(s.queries.ProbeTable(ctx, s.pool))
}

// mapErr adds to err what the user must do about it, keeping err itself
// reachable with errors.As.
func mapErr(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case undefinedTable, undefinedColumn:
		return fmt.Errorf("%w: %w", driver.ErrNotMigrated, err)
	case duplicatePreparedStatement, invalidSQLStatementName:
		return fmt.Errorf("txlimit/pgstore: a prepared statement was lost between transactions, "+
			"as happens behind PgBouncer in transaction mode with pgx's default exec mode; set "+
			"DefaultQueryExecMode to pgx.QueryExecModeExec or QueryExecModeSimpleProtocol on the pool's config: %w", err)
	}
	return err
}

// lockTimer adds up the time spent in statements that take row locks, when
// asked to (TimeLocks).
type lockTimer struct {
	on    bool
	total time.Duration
}

func (t *lockTimer) start() time.Time {
	if !t.on {
		return time.Time{}
	}
	return time.Now()
}

func (t *lockTimer) stop(start time.Time) {
	if t.on {
		t.total += time.Since(start)
	}
}

// Take implements driver.Store. A sharded limit is first served from the
// first shard no other transaction holds (takeOneShard); when that shard
// lacks the tokens, a denial the committed state already decides is
// answered without a lock; otherwise every shard is locked, in shard order.
func (s *Store) Take(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	res, err := s.take(ctx, tx, p)
	return res, mapErr(err)
}

func (s *Store) take(ctx context.Context, tx pgx.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	lt := lockTimer{on: p.TimeLocks}
	if p.Shards == 1 && driver.InSQL(p) {
		res, done, err := s.takeInSQL(ctx, tx, p, &lt)
		if err != nil || done {
			res.LockWait = lt.total
			return res, err
		}
	}
	if driver.FitsOneShard(p) {
		res, done, err := s.takeOneShard(ctx, tx, p, &lt)
		if err != nil || done {
			res.LockWait = lt.total
			return res, err
		}
	}
	if p.Shards > 1 && !p.Reserve {
		// Before queueing on every shard, see whether the committed state
		// already rules the request out. Concurrent transactions can only
		// lower it further (a concurrent Credit or Reset is ordered after
		// this call), so such a denial is right without any lock.
		read, err := s.read(ctx, tx, p.Name, p.Key, p.Now)
		if err != nil {
			return driver.TakeResult{}, err
		}
		states, _ := p.States(read.Rows, read.At.UnixMicro())
		if _, d := algo.TakeShards(p.Shard(p.Shards), states, read.At.UnixMicro(), p.Count, false); !d.OK {
			return driver.TakeResult{Decision: d, At: read.At, States: states, LockWait: lt.total}, nil
		}
	}
	rows, at, err := s.lockKey(ctx, tx, p.Limit, p.Now, &lt)
	if err != nil {
		return driver.TakeResult{}, err
	}
	next, d, write := driver.Decide(p, rows, at)
	if write {
		if err := s.store(ctx, tx, p.Limit, rows, next); err != nil {
			return driver.TakeResult{}, err
		}
	}
	return driver.TakeResult{Decision: d, At: at, States: next, LockWait: lt.total}, nil
}

// takeInSQL takes from an unsharded limit in one statement, TakeRow,
// which creates or locks the row, refills, decides and writes in SQL. done
// is false when the statement granted nothing (a denial, or a stored value
// that is not finite): the row is then locked, and the caller takes its
// locked path, which decides with algo in Go, so that a denial costs one
// more round trip. Whichever path writes, the state is algo's
// (TestTakeRowMatchesAlgo).
func (s *Store) takeInSQL(ctx context.Context, tx pgx.Tx, p driver.TakeParams, lt *lockTimer) (driver.TakeResult, bool, error) {
	defer lt.stop(lt.start())
	c := p.Config
	full := p.Full()
	r, err := s.queries.TakeRow(ctx, tx, db.TakeRowParams{
		Name: p.Name, Key: p.Key, Shard: 0, FullValue: full.Value, FullTs: time.UnixMicro(full.TS), Now: p.Now,
		Kind: int32(c.Kind), Rate: c.Rate, Period: c.Period, Capacity: c.Capacity, MaxReserved: c.MaxReserved,
		Count: p.Count, Reserve: p.Reserve,
	})
	if err != nil {
		return driver.TakeResult{}, false, ignoreNoRows(err)
	}
	next := algo.State{Value: r.Value, TS: r.Ts.UnixMicro()}
	return driver.TakeResult{Decision: driver.Granted(c, next, r.Clock.UnixMicro()), At: r.Clock, States: []algo.State{next}}, true, nil
}

func ignoreNoRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

const (
	savepoint         = "SAVEPOINT txlimit_try"
	releaseSavepoint  = "RELEASE SAVEPOINT txlimit_try"
	rollbackSavepoint = "ROLLBACK TO SAVEPOINT txlimit_try"
)

// takeOneShard is the fast path of a sharded limit: lock the first shard,
// going up from a random one, that no other transaction holds, and take from
// it alone when it has enough. The lock is taken inside a savepoint that is
// released (keeping the lock) when the shard grants, and rolled back
// (letting the lock go) when it does not; done is then false and the caller
// locks every shard. With ReadAll the other shards are read, as last
// committed, in the same statement; without it the result is Partial.
func (s *Store) takeOneShard(ctx context.Context, tx pgx.Tx, p driver.TakeParams, lt *lockTimer) (driver.TakeResult, bool, error) {
	start := int32(rand.IntN(p.Shards))
	lockStart := lt.start()
	tried, err := s.tryLockShard(ctx, tx, p, start)
	if err == nil && !tried.locked && tried.top == int32(p.Shards-1) {
		// Every shard is held. Queue for one, the random first choice,
		// rather than for all of them: holding nothing of this key while
		// waiting for a single row cannot deadlock, and locking every
		// shard here would make each call that starts meanwhile find them
		// all busy too.
		all := tried.all
		tried, err = s.waitShard(ctx, tx, p, start)
		tried.all = all
	}
	lt.stop(lockStart)
	if err != nil {
		// The savepoint may be open: the transaction has failed anyway,
		// and its rollback ends it.
		return driver.TakeResult{}, false, err
	}
	if tried.locked && tried.top == int32(p.Shards-1) {
		next, d := driver.DecideOne(p, tried.row, tried.now)
		if d.OK {
			b := &pgx.Batch{}
			err := queued(s.queries.WriteShard(ctx, queuer{b}, db.WriteShardParams{
				Name: p.Name, Key: p.Key, Shard: tried.row.Shard, Value: next.Value, Ts: time.UnixMicro(next.TS),
			}))
			if err != nil {
				return driver.TakeResult{}, false, err
			}
			b.Queue(releaseSavepoint)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return driver.TakeResult{}, false, err
			}
			res := driver.TakeResult{Decision: d, At: tried.now, Partial: true}
			if p.ReadAll {
				res.States, _ = p.States(tried.all, tried.now.UnixMicro())
				res.States[tried.row.Shard] = next
				res.Partial = false
			}
			return res, true, nil
		}
	}
	// The shard lacks the tokens, every row is missing, or the key has rows
	// of another Shards (top): let the shard go and lock every row.
	b := &pgx.Batch{}
	b.Queue(rollbackSavepoint)
	b.Queue(releaseSavepoint)
	return driver.TakeResult{}, false, tx.SendBatch(ctx, b).Close()
}

// tried is what tryLockShard or waitShard found.
type tried struct {
	row    driver.Row
	locked bool
	// top is the highest shard the key has (-1 for none), when the
	// statement read it; all is every row, with ReadAll.
	top int32
	all []driver.Row
	now time.Time
}

// tryLockShard opens the savepoint and locks the first free shard from
// start, in one round trip; with ReadAll it reads every row in the same
// statement.
func (s *Store) tryLockShard(ctx context.Context, tx pgx.Tx, p driver.TakeParams, start int32) (tried, error) {
	b := &pgx.Batch{}
	b.Queue(savepoint)
	var out tried
	if p.ReadAll {
		_, err := s.queries.TryLockShardAndRead(ctx, queuer{b}, db.TryLockShardAndReadParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		if err := queued(err); err != nil {
			return tried{}, err
		}
		out.top = -1
	} else {
		_, err := s.queries.TryLockShard(ctx, queuer{b}, db.TryLockShardParams{Name: p.Name, Key: p.Key, Start: start, Now: p.Now})
		if err := queued(err); err != nil {
			return tried{}, err
		}
	}
	res := tx.SendBatch(ctx, b)
	_, err := res.Exec()
	switch {
	case err != nil:
	case p.ReadAll:
		var rows pgx.Rows
		rows, err = res.Query()
		if err == nil {
			var r db.TryLockShardAndReadRow
			_, err = pgx.ForEachRow(rows, []any{&r.Shard, &r.Value, &r.Ts, &r.Clock, &r.LockedShard, &r.LockedValue, &r.LockedTs}, func() error {
				out.now = r.Clock
				if r.Shard != nil {
					out.all = append(out.all, driver.Row{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
					out.top = max(out.top, *r.Shard)
				}
				if r.LockedShard != nil {
					out.row = driver.Row{Shard: *r.LockedShard, Value: *r.LockedValue, TS: *r.LockedTs}
					out.locked = true
				}
				return nil
			})
		}
	default:
		var r db.TryLockShardRow
		err = res.QueryRow().Scan(&r.Shard, &r.Value, &r.Ts, &r.Clock, &r.TopShard)
		switch {
		case err == nil:
			out = tried{row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, locked: true, top: r.TopShard, now: r.Clock}
		case errors.Is(err, pgx.ErrNoRows):
			// Every row is held or missing; which of the two is unknown,
			// so say every shard may exist.
			out, err = tried{top: int32(p.Shards - 1)}, nil
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return out, err
}

// waitShard locks one row, waiting for the transaction that holds it, inside
// the savepoint tryLockShard opened. A missing row comes back unlocked at
// once (the caller then locks every row, creating them).
func (s *Store) waitShard(ctx context.Context, tx pgx.Tx, p driver.TakeParams, shard int32) (tried, error) {
	r, err := s.queries.WaitShard(ctx, tx, db.WaitShardParams{Name: p.Name, Key: p.Key, Shard: shard, Now: p.Now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return tried{top: -1}, nil
	case err != nil:
		return tried{}, err
	}
	return tried{row: driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}, locked: true, top: r.TopShard, now: r.Clock}, nil
}

// lockKey locks every row of l's key, waiting, in shard order, and returns
// them with the clock read once they are held. A key with no row gets rows
// 0..Shards-1, created full and locked, first.
func (s *Store) lockKey(ctx context.Context, tx pgx.Tx, l driver.Limit, now *time.Time, lt *lockTimer) ([]driver.Row, time.Time, error) {
	defer lt.stop(lt.start())
	rows, at, err := s.lockShards(ctx, tx, l, now)
	if err != nil || len(rows) > 0 {
		return rows, at, err
	}
	if err := s.insertShards(ctx, tx, l); err != nil {
		return nil, time.Time{}, err
	}
	return s.lockShards(ctx, tx, l, now)
}

func (s *Store) lockShards(ctx context.Context, tx pgx.Tx, l driver.Limit, now *time.Time) ([]driver.Row, time.Time, error) {
	rows, err := s.queries.LockShards(ctx, tx, db.LockShardsParams{Name: l.Name, Key: l.Key, Now: now})
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]driver.Row, len(rows))
	var at time.Time
	for i, r := range rows {
		out[i] = driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}
		if r.Clock.After(at) {
			at = r.Clock // read before each row's lock: the latest is nearest to holding them all
		}
	}
	if len(rows) == 0 {
		at = clock(now)
	}
	return out, at, nil
}

// clock is the instant of a call that read no row: the injected clock, or
// the zero time, which no caller uses (there is nothing to decide on).
func clock(now *time.Time) time.Time {
	if now != nil {
		return *now
	}
	return time.Time{}
}

// insertShards creates the missing rows 0..Shards-1 of l's key, full, and
// locks the existing ones, in shard order.
func (s *Store) insertShards(ctx context.Context, tx pgx.Tx, l driver.Limit) error {
	full := l.Full()
	return s.queries.InsertShards(ctx, tx, db.InsertShardsParams{
		Name: l.Name, Key: l.Key, Shards: int32(l.Shards), Value: full.Value, Ts: time.UnixMicro(full.TS),
	})
}

// store writes states to the rows 0..Shards-1 of l's key, whose rows (all
// of them, held by tx) were had; a reshard to more shards creates the
// missing rows first, and one to fewer deletes the extra ones, in the same
// round trip as the write.
func (s *Store) store(ctx context.Context, tx pgx.Tx, l driver.Limit, had []driver.Row, states []algo.State) error {
	if len(had) < l.Shards {
		if err := s.insertShards(ctx, tx, l); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	if err := s.queueWrite(ctx, b, l, states); err != nil {
		return err
	}
	if extra := driver.Extra(had, l.Shards); len(extra) > 0 {
		var p db.DeleteShardsParams
		for _, shard := range extra {
			addRow(&p, l.Name, l.Key, shard)
		}
		if _, err := s.queries.DeleteShards(ctx, queuer{b}, p); queued(err) != nil {
			return queued(err)
		}
	}
	return s.send(ctx, tx, b)
}

// send runs the batch, as one statement when it holds one.
func (s *Store) send(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	if len(b.QueuedQueries) == 1 {
		q := b.QueuedQueries[0]
		_, err := tx.Exec(ctx, q.SQL, q.Arguments...)
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}

// queueWrite queues the statement that stores states on l's rows: a
// one-row UPDATE for an unsharded limit (whose plan stays generic), one
// UPDATE for several shards.
func (s *Store) queueWrite(ctx context.Context, b *pgx.Batch, l driver.Limit, states []algo.State) error {
	if len(states) == 1 {
		return queued(s.queries.WriteShard(ctx, queuer{b}, db.WriteShardParams{
			Name: l.Name, Key: l.Key, Shard: 0, Value: states[0].Value, Ts: time.UnixMicro(states[0].TS),
		}))
	}
	p := db.WriteKeyShardsParams{Name: l.Name, Key: l.Key,
		Shards: make([]int32, len(states)), Vals: make([]float64, len(states)), Tss: make([]time.Time, len(states))}
	for i, st := range states {
		p.Shards[i], p.Vals[i], p.Tss[i] = int32(i), st.Value, time.UnixMicro(st.TS)
	}
	return queued(s.queries.WriteKeyShards(ctx, queuer{b}, p))
}

// Read implements driver.Store.
func (s *Store) Read(ctx context.Context, tx pgx.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	res, err := s.read(ctx, tx, p.Name, p.Key, p.Now)
	return res, mapErr(err)
}

func (s *Store) read(ctx context.Context, tx pgx.Tx, name, key string, now *time.Time) (driver.ReadResult, error) {
	rows, err := s.queries.ReadShards(ctx, tx, db.ReadShardsParams{Name: name, Key: key, Now: now})
	if err != nil {
		return driver.ReadResult{}, err
	}
	var out driver.ReadResult
	for _, r := range rows {
		out.At = r.Clock
		if r.Shard != nil {
			out.Rows = append(out.Rows, driver.Row{Shard: *r.Shard, Value: *r.Value, TS: *r.Ts})
		}
	}
	return out, nil
}

// Credit implements driver.Store. A key with no row is full: there is
// nothing to give back to it.
func (s *Store) Credit(ctx context.Context, tx pgx.Tx, p driver.CreditParams) error {
	rows, at, err := s.lockShards(ctx, tx, p.Limit, p.Now)
	if err == nil && len(rows) > 0 {
		err = s.store(ctx, tx, p.Limit, rows, driver.CreditStates(p, rows, at))
	}
	return mapErr(err)
}

// Delete implements driver.Store.
func (s *Store) Delete(ctx context.Context, tx pgx.Tx, p driver.KeyParams) error {
	return mapErr(s.queries.DeleteKey(ctx, tx, db.DeleteKeyParams{Name: p.Name, Key: p.Key}))
}

// TakeAll implements driver.Store: the insert that takes the locks in the
// canonical order and the read of the locked rows go to the server in one
// round trip, and the writes (or, for a denial, the removal of the rows the
// insert created) in one more.
func (s *Store) TakeAll(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	res, err := s.takeAll(ctx, tx, p)
	return res, mapErr(err)
}

func (s *Store) takeAll(ctx context.Context, tx pgx.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	n := len(p.Takes)
	ins := db.InsertKeysParams{
		Names: make([]string, n), Keys: make([]string, n), ShardCounts: make([]int32, n),
		Vals: make([]float64, n), Tss: make([]time.Time, n),
	}
	index := make(map[driver.KeyRef]int, n)
	for i, j := range driver.CanonicalOrder(p.Takes) {
		t := p.Takes[j]
		full := t.Full()
		ins.Names[i], ins.Keys[i], ins.ShardCounts[i], ins.Vals[i], ins.Tss[i] = t.Name, t.Key, int32(t.Shards), full.Value, time.UnixMicro(full.TS)
		index[driver.KeyRef{Name: t.Name, Key: t.Key}] = j
	}
	lt := lockTimer{on: p.TimeLocks}
	lockStart := lt.start()
	b := &pgx.Batch{}
	_, err := s.queries.InsertKeys(ctx, queuer{b}, ins)
	if err = queued(err); err == nil {
		_, err = s.queries.LockKeys(ctx, queuer{b}, db.LockKeysParams{Now: p.Now, Names: ins.Names, Keys: ins.Keys})
		err = queued(err)
	}
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	res := tx.SendBatch(ctx, b)
	created := make(map[driver.KeyRef][]int32)
	rows, err := res.Query()
	if err == nil {
		var r db.InsertKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard}, func() error {
			k := driver.KeyRef{Name: r.Name, Key: r.Key}
			created[k] = append(created[k], r.Shard)
			return nil
		})
	}
	// had holds each key's rows as they were before InsertKeys: the rows
	// it created are full placeholders, which a reshard must not count.
	had := make([][]driver.Row, n)
	all := make([][]driver.Row, n)
	var at time.Time
	if err == nil {
		rows, err = res.Query()
	}
	if err == nil {
		var r db.LockKeysRow
		_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Key, &r.Shard, &r.Value, &r.Ts, &r.Clock}, func() error {
			k := driver.KeyRef{Name: r.Name, Key: r.Key}
			i := index[k]
			row := driver.Row{Shard: r.Shard, Value: r.Value, TS: r.Ts}
			all[i] = append(all[i], row)
			if !containsShard(created[k], r.Shard) {
				had[i] = append(had[i], row)
			}
			if at.IsZero() {
				at = r.Clock // clock_timestamp() is read per row, after every lock is held
			}
			return nil
		})
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	lt.stop(lockStart)
	if err != nil {
		return driver.TakeAllResult{}, err
	}
	out, writes := driver.DecideAll(p, had, at)
	out.LockWait = lt.total
	b = &pgx.Batch{}
	var doomed db.DeleteShardsParams
	for i, t := range p.Takes {
		if writes[i] == nil {
			// A denied limit keeps its rows as they were: those
			// InsertKeys created (full, so equal to no row) go again.
			for _, sh := range created[driver.KeyRef{Name: t.Name, Key: t.Key}] {
				addRow(&doomed, t.Name, t.Key, sh)
			}
			continue
		}
		if err := s.queueWrite(ctx, b, t.Limit, out.Results[i].States); err != nil {
			return driver.TakeAllResult{}, err
		}
		for _, sh := range driver.Extra(all[i], t.Shards) {
			addRow(&doomed, t.Name, t.Key, sh)
		}
	}
	if len(doomed.Shards) > 0 {
		if _, err := s.queries.DeleteShards(ctx, queuer{b}, doomed); queued(err) != nil {
			return driver.TakeAllResult{}, queued(err)
		}
	}
	if len(b.QueuedQueries) > 0 {
		if err := s.send(ctx, tx, b); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	return out, nil
}

// addRow adds one row to the rows a DeleteShards statement deletes.
func addRow(p *db.DeleteShardsParams, name, key string, shard int32) {
	p.Names, p.Keys, p.Shards = append(p.Names, name), append(p.Keys, key), append(p.Shards, shard)
}

func containsShard(shards []int32, shard int32) bool {
	for _, s := range shards {
		if s == shard {
			return true
		}
	}
	return false
}

// Prune implements driver.Store. The rows are locked with FOR UPDATE SKIP
// LOCKED, so a batch never waits for a row that live traffic holds: a key
// with a row held elsewhere is left for a later run.
func (s *Store) Prune(ctx context.Context, tx pgx.Tx, p driver.PruneParams) (driver.PruneResult, error) {
	res, err := s.prune(ctx, tx, p)
	return res, mapErr(err)
}

func (s *Store) prune(ctx context.Context, tx pgx.Tx, p driver.PruneParams) (driver.PruneResult, error) {
	keys, err := s.queries.ScanKeys(ctx, tx, db.ScanKeysParams{AfterName: p.After.Name, AfterKey: p.After.Key, MaxKeys: int32(p.Max)})
	if err != nil || len(keys) == 0 {
		return driver.PruneResult{}, err
	}
	out := driver.PruneResult{Keys: len(keys), Last: driver.KeyRef{Name: keys[len(keys)-1].Name, Key: keys[len(keys)-1].Key}}
	lock := db.LockIdleParams{Now: p.Now}
	for _, k := range keys {
		if !p.Known(k.Name) {
			out.Unknown++
			continue
		}
		lock.Names, lock.Keys = append(lock.Names, k.Name), append(lock.Keys, k.Key)
	}
	if len(lock.Names) == 0 {
		return out, nil
	}
	rows, err := s.queries.LockIdle(ctx, tx, lock)
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
	var doomed db.DeleteShardsParams
	for i := 0; i < len(rows); {
		j := i
		var keyRows []driver.Row
		for ; j < len(rows) && rows[j].Name == rows[i].Name && rows[j].Key == rows[i].Key; j++ {
			keyRows = append(keyRows, driver.Row{Shard: rows[j].Shard, Value: rows[j].Value, TS: rows[j].Ts})
		}
		// Delete a key only when this transaction holds every row of it.
		if int64(len(keyRows)) == rows[i].Total {
			if p.Full(rows[i].Name, rows[i].Key, keyRows, at) {
				for _, r := range keyRows {
					addRow(&doomed, rows[i].Name, rows[i].Key, r.Shard)
				}
			}
		}
		i = j
	}
	if len(doomed.Shards) > 0 {
		n, err := s.queries.DeleteShards(ctx, tx, doomed)
		if err != nil {
			return driver.PruneResult{}, err
		}
		out.Deleted = int(n)
	}
	return out, nil
}
