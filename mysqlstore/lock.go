package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	gen "github.com/txlimit/txlimit/mysqlstore/internal/db"
	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// The store's statements: sqlc's (queries/mysql), and the ones on lists of
// rows, which sqlc's MySQL engine cannot compile (internal/rawsql/rows.sql).
var (
	queries                                    = gen.New()
	ensureRowsSQL, writeRowsSQL, deleteRowsSQL = rawsql.Get("EnsureRows").SQL, rawsql.Get("WriteRows").SQL, rawsql.Get("DeleteRows").SQL
	topsSQL, lockRowsSQL, lockIdleSQL          = rawsql.Get("Tops").SQL, rawsql.Get("LockRows").SQL, rawsql.Get("LockIdle").SQL
)

// ensure creates and locks rows 0..Shards-1 of each limit, in the order
// given (which must be the canonical one when there are several).
func ensure(ctx context.Context, tx *sql.Tx, limits ...driver.Limit) error {
	var rows []rowWrite
	for _, l := range limits {
		full := placeholder(l)
		for sh := range l.Shards {
			rows = append(rows, put(l, int32(sh), full))
		}
	}
	arg, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, ensureRowsSQL, arg); err != nil {
		return wrap(ctx, tx, "create and lock the limit's rows", err)
	}
	return nil
}

// placeholder is the row ensure creates for l.
func placeholder(l driver.Limit) algo.State { return l.Full() }

// put is the row that stores state s of shard of l. Row 0 of a sharded
// limit of a kind that leaves algo.State.Prev unused (every kind but the
// sliding window, whose Prev is its previous window's count) carries the
// number of shards there: takerow's one statement, which serves an
// unsharded limit from row 0 alone, takes only a row whose prev is 0, so
// that a key whose rows a sharded config wrote is left to the locked path,
// which pools them (a redeployed Shards), without reading the key's other
// rows (which, in the statement that creates row 0, would lock the gap
// after it). algo reads Prev for the sliding window only, so the number
// changes no decision.
func put(l driver.Limit, shard int32, s algo.State) rowWrite {
	if shard == 0 && l.Shards > 1 && l.Config.Kind != algo.SlidingWindow {
		s.Prev = float64(l.Shards)
	}
	return rowWrite{name: l.Name, key: l.Key, shard: shard, state: s}
}

// isPlaceholder reports whether r is exactly a row ensure created for l.
// Such a row is full, the same as no row: a real write never stamps it with
// the full state's time, which precedes any clock by years. The locked path
// counts it as missing, so that a key with fewer rows than l's Shards is
// resharded rather than taken as l's.
func isPlaceholder(l driver.Limit, r driver.Row) bool {
	full := put(l, r.Shard, placeholder(l)).state
	return r.Value == full.Value && r.Prev == full.Prev && r.TS.UnixMicro() == full.TS
}

// shards is from..to-1.
func shards(from, to int) []int32 {
	out := make([]int32, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, int32(i))
	}
	return out
}

// locked is every row of a key that lockKey holds.
type locked struct {
	// had are the rows as they were before the call: placeholders left
	// out.
	had []driver.Row
	// created are the placeholders (rows ensure created, or left by an
	// earlier call that did not write them).
	created []int32
	// all are every row held, placeholders included.
	all []driver.Row
	at  time.Time
}

// lockKey locks every row of l's key, creating the missing ones of shards
// 0..Shards-1 first, in ascending shard order, and reads them with the
// clock, read once they are held. Rows beyond Shards-1 (another config's)
// are locked after them, still in shard order.
func lockKey(ctx context.Context, tx *sql.Tx, l driver.Limit, now *time.Time) (locked, error) {
	if err := ensure(ctx, tx, l); err != nil {
		return locked{}, err
	}
	rows, err := queries.LockShards(ctx, tx, gen.LockShardsParams{Name: []byte(l.Name), Key: []byte(l.Key), Shards: shards(0, l.Shards)})
	if err != nil {
		return locked{}, wrap(ctx, tx, "lock the limit's rows", err)
	}
	if len(rows) == 0 {
		return locked{}, fmt.Errorf("txlimit/mysqlstore: lock the limit's rows: none found after creating them")
	}
	var out locked
	out.at = rows[0].Clock
	top := rows[0].Top
	for _, r := range rows {
		out.all = append(out.all, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts})
		if err := checkUTC(r.Ts, r.Clock); err != nil {
			return locked{}, err
		}
	}
	if top >= int64(l.Shards) {
		more, err := queries.LockShards(ctx, tx, gen.LockShardsParams{Name: []byte(l.Name), Key: []byte(l.Key), Shards: shards(l.Shards, int(top)+1)})
		if err != nil {
			return locked{}, wrap(ctx, tx, "lock the rows of another config's shards", err)
		}
		for _, r := range more {
			out.all = append(out.all, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts})
		}
	}
	for _, r := range out.all {
		if int(r.Shard) < l.Shards && isPlaceholder(l, r) {
			out.created = append(out.created, r.Shard)
		} else {
			out.had = append(out.had, r)
		}
	}
	if now != nil {
		out.at = time.UnixMicro(now.UnixMicro()).UTC()
	}
	return out, nil
}

// rowWrite is the new state of one row.
type rowWrite struct {
	name, key string
	shard     int32
	state     algo.State
}

// rowRef names one row.
type rowRef struct {
	name, key string
	shard     int32
}

func (w rowWrite) MarshalJSON() ([]byte, error) {
	if err := checkTime("a limit's state", time.UnixMicro(w.state.TS)); err != nil {
		return nil, err
	}
	return json.Marshal([]any{hexOf(w.name), hexOf(w.key), w.shard,
		formatFloat(w.state.Value), formatTime(time.UnixMicro(w.state.TS)), formatFloat(w.state.Prev)})
}

func (r rowRef) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{hexOf(r.name), hexOf(r.key), r.shard})
}

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// formatFloat is the shortest decimal that reads back as v.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// formatTime is t in UTC as a DATETIME(6) literal.
func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }

// write stores writes and deletes doomed: one statement each (WriteShard
// for a single row), none for an empty list.
func write(ctx context.Context, tx *sql.Tx, writes []rowWrite, doomed []rowRef) error {
	switch len(writes) {
	case 0:
	case 1:
		w := writes[0]
		if err := checkTime("a limit's state", time.UnixMicro(w.state.TS)); err != nil {
			return err
		}
		if err := queries.WriteShard(ctx, tx, gen.WriteShardParams{
			Value: w.state.Value, Prev: w.state.Prev, Ts: time.UnixMicro(w.state.TS).UTC(), Name: []byte(w.name), Key: []byte(w.key), Shard: w.shard,
		}); err != nil {
			return wrap(ctx, tx, "write the limit's rows", err)
		}
	default:
		arg, err := json.Marshal(writes)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, writeRowsSQL, arg); err != nil {
			return wrap(ctx, tx, "write the limit's rows", err)
		}
	}
	if len(doomed) > 0 {
		if _, err := deleteRows(ctx, tx, doomed); err != nil {
			return err
		}
	}
	return nil
}

func deleteRows(ctx context.Context, tx *sql.Tx, rows []rowRef) (int64, error) {
	arg, err := json.Marshal(rows)
	if err != nil {
		return 0, err
	}
	r, err := tx.ExecContext(ctx, deleteRowsSQL, arg)
	if err != nil {
		return 0, wrap(ctx, tx, "delete rows", err)
	}
	n, err := r.RowsAffected()
	return n, wrap(ctx, tx, "delete rows", err)
}

// store writes states to rows 0..Shards-1 of l's key, which the
// transaction holds (all of them), and deletes the rows beyond them.
func store(ctx context.Context, tx *sql.Tx, l driver.Limit, all []driver.Row, states []algo.State) error {
	writes := make([]rowWrite, len(states))
	for i, s := range states {
		writes[i] = put(l, int32(i), s)
	}
	var doomed []rowRef
	for _, sh := range driver.Extra(all, l.Shards) {
		doomed = append(doomed, rowRef{name: l.Name, key: l.Key, shard: sh})
	}
	return write(ctx, tx, writes, doomed)
}

// forget deletes the placeholders k holds, when the call writes nothing:
// the key then keeps no row it did not have.
func forget(ctx context.Context, tx *sql.Tx, l driver.Limit, k locked) error {
	if len(k.created) == 0 {
		return nil
	}
	_, err := queries.DeleteShards(ctx, tx, gen.DeleteShardsParams{Name: []byte(l.Name), Key: []byte(l.Key), Shards: k.created})
	return wrap(ctx, tx, "delete the rows the call created", err)
}

// take is driver.Store.Take. An unsharded limit is taken in one statement
// (takeRow; returning: the server is MariaDB, whose RETURNING gives the
// result in the same round trip); a sharded one, from one shard no other transaction holds when
// one has the tokens (takeOneShard); anything else, and whatever those leave
// undecided, locks every row of the key and decides in Go (driver.Decide).
func take(ctx context.Context, tx *sql.Tx, p driver.TakeParams, returning bool) (driver.TakeResult, error) {
	var start time.Time
	if p.TimeLocks {
		start = time.Now()
	}
	lockWait := func() time.Duration {
		if p.TimeLocks {
			return time.Since(start)
		}
		return 0
	}
	if p.Shards == 1 && driver.InSQL(p) {
		res, done, err := takeRow(ctx, tx, p, returning)
		if err != nil || done {
			res.LockWait = lockWait()
			return res, err
		}
	}
	// A reservation on a sharded limit locks every shard: the fast path
	// grants from one shard only what that shard has.
	if driver.FitsOneShard(p) && !p.Reserve {
		res, done, err := takeOneShard(ctx, tx, p)
		if err != nil || done {
			res.LockWait = lockWait()
			return res, err
		}
	}
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.TakeResult{}, err
		}
	}
	k, err := lockKey(ctx, tx, p.Limit, p.Now)
	if err != nil {
		return driver.TakeResult{}, err
	}
	res, write := driver.Decide(p, k.had, k.at)
	res.LockWait = lockWait()
	if write {
		return res, store(ctx, tx, p.Limit, k.all, res.States)
	}
	return res, forget(ctx, tx, p.Limit, k)
}

// takeOneShard is the fast path of a sharded limit. It reads every shard
// as the transaction's snapshot has it (locking nothing) and answers a
// denial that state already decides: concurrent transactions can only lower
// it. Otherwise it locks, without waiting, one shard that the snapshot says
// holds plenty and that no other transaction holds (FOR UPDATE SKIP
// LOCKED), going round from a random one, and takes from it when it has the
// tokens. done is false when it locked nothing: the caller then locks every
// shard, in shard order, waiting.
//
// InnoDB keeps a row lock until the transaction ends, even one taken after
// a savepoint that was rolled back. So, unlike PostgreSQL, the store cannot
// let go of a shard that turns out to lack the tokens (another call took
// them since the snapshot): holding it, it must not wait for the other
// shards, since a call that locks every shard in order may hold those and
// wait for this one (a deadlock InnoDB ends by rolling one caller back). It
// locks a shard only when the snapshot gives it twice the count, which makes
// that rare, and when it happens it takes the other shards that are free
// without waiting (takeFromFree).
func takeOneShard(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, bool, error) {
	read, err := readShards(ctx, tx, p.Name, p.Key, p.Now)
	if err != nil {
		return driver.TakeResult{}, false, err
	}
	at := read.At.UnixMicro()
	states, resharded := p.States(read.Rows, at)
	if resharded || len(read.Rows) != p.Shards {
		return driver.TakeResult{}, false, nil // new, or another config's rows: lock every shard
	}
	cfg := p.Shard(p.Shards)
	if _, d := algo.TakeShards(cfg, states, at, p.Count, false); !d.OK {
		return driver.TakeResult{Decision: d, At: read.At, States: states}, true, nil
	}
	margin := 2 * p.Count
	start := rand.IntN(p.Shards)
	for i := range p.Shards {
		shard := (start + i) % p.Shards
		if algo.Pooled(cfg, states[shard:shard+1], at) < margin {
			continue
		}
		row, err := queries.TryLockShard(ctx, tx, gen.TryLockShardParams{Name: []byte(p.Name), Key: []byte(p.Key), Shard: int32(shard)})
		if errors.Is(err, sql.ErrNoRows) {
			continue // another transaction holds it
		}
		if err != nil {
			return driver.TakeResult{}, false, wrap(ctx, tx, "lock a shard", err)
		}
		if err := checkUTC(row.Ts, row.Clock); err != nil {
			return driver.TakeResult{}, false, err
		}
		now := row.Clock
		if p.Now != nil {
			now = time.UnixMicro(p.Now.UnixMicro()).UTC()
		}
		held := driver.Row{Shard: row.Shard, Value: row.Value, Prev: row.Prev, TS: row.Ts}
		next, d := driver.DecideOne(p, held, now)
		if !d.OK {
			res, err := takeFromFree(ctx, tx, p, held, states, now)
			return res, err == nil, err
		}
		if err := write(ctx, tx, []rowWrite{put(p.Limit, row.Shard, next)}, nil); err != nil {
			return driver.TakeResult{}, false, err
		}
		res := driver.TakeResult{Decision: d, At: now, Partial: true, Taken: p.Count}
		if p.ReadAll {
			res.States = slices.Clone(states)
			res.States[shard] = next
			res.Partial = false
		}
		return res, true, nil
	}
	return driver.TakeResult{}, false, nil
}

// takeFromFree decides a sharded call whose one locked shard, held, lacks
// the tokens, without waiting for any other shard (see takeOneShard): it
// locks every other shard that no transaction holds (SKIP LOCKED) and
// decides on every shard it then holds, as on one limit of that many
// shards (algo.TakeShards), which never admits more than the whole limit
// could. When it holds every shard that is the store's usual decision; when
// some are held elsewhere and those it holds lack the tokens, the call is
// denied, with the wait until the shards it holds would have them: more
// than the wait of the whole limit, never less. snapshot is every shard as
// the transaction's snapshot had it.
func takeFromFree(ctx context.Context, tx *sql.Tx, p driver.TakeParams, held driver.Row, snapshot []algo.State, now time.Time) (driver.TakeResult, error) {
	var others []int32
	for sh := range p.Shards {
		if int32(sh) != held.Shard {
			others = append(others, int32(sh))
		}
	}
	free, err := queries.TryLockShards(ctx, tx, gen.TryLockShardsParams{Name: []byte(p.Name), Key: []byte(p.Key), Shards: others})
	if err != nil {
		return driver.TakeResult{}, wrap(ctx, tx, "lock the free shards", err)
	}
	rows := []driver.Row{held}
	for _, r := range free {
		rows = append(rows, driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts})
	}
	slices.SortFunc(rows, func(a, b driver.Row) int { return int(a.Shard) - int(b.Shard) })
	at := now.UnixMicro()
	if len(rows) == p.Shards {
		res, write := driver.Decide(p, rows, now)
		if !write {
			return res, nil
		}
		return res, store(ctx, tx, p.Limit, rows, res.States)
	}
	cfg := p.Shard(p.Shards)
	states := make([]algo.State, len(rows))
	for i, r := range rows {
		states[i] = r.State()
	}
	next, d := algo.TakeShards(cfg, states, at, p.Count, false)
	res := driver.TakeResult{Decision: d, At: now, Partial: true}
	if d.OK {
		res.Taken = p.Count
	}
	if !d.OK {
		res.Partial = false
		res.States = slices.Clone(snapshot)
		for i, r := range rows {
			res.States[r.Shard] = states[i]
		}
		return res, nil
	}
	writes := make([]rowWrite, len(rows))
	for i, r := range rows {
		writes[i] = put(p.Limit, r.Shard, next[i])
	}
	if p.ReadAll {
		res.Partial = false
		res.States = slices.Clone(snapshot)
		for i, r := range rows {
			res.States[r.Shard] = next[i]
		}
	}
	return res, write(ctx, tx, writes, nil)
}

// readShards reads every row of (name, key) as the transaction's snapshot
// has them, and the clock, locking nothing.
func readShards(ctx context.Context, tx *sql.Tx, name, key string, now *time.Time) (driver.ReadResult, error) {
	rows, err := queries.ReadShards(ctx, tx, gen.ReadShardsParams{Name: []byte(name), Key: []byte(key)})
	if err != nil {
		return driver.ReadResult{}, wrap(ctx, tx, "read the limit's rows", err)
	}
	out := driver.ReadResult{Rows: make([]driver.Row, len(rows))}
	for i, r := range rows {
		out.Rows[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts}
		if err := checkUTC(r.Ts); err != nil {
			return driver.ReadResult{}, err
		}
	}
	if now != nil {
		if err := checkTime("the clock", *now); err != nil {
			return driver.ReadResult{}, err
		}
		out.At = time.UnixMicro(now.UnixMicro()).UTC()
		return out, nil
	}
	out.At, err = queries.Clock(ctx, tx)
	if err != nil {
		return driver.ReadResult{}, wrap(ctx, tx, "read the clock", err)
	}
	return out, checkUTC(out.At)
}

// credit is driver.Store.Credit. A key with no row is full: there is nothing
// to give back to it.
func credit(ctx context.Context, tx *sql.Tx, p driver.CreditParams) error {
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return err
		}
	}
	k, err := lockKey(ctx, tx, p.Limit, p.Now)
	if err != nil {
		return err
	}
	if len(k.had) == 0 {
		return forget(ctx, tx, p.Limit, k)
	}
	return store(ctx, tx, p.Limit, k.all, driver.CreditStates(p, k.had, k.at))
}

// reset is driver.Store.Reset.
func reset(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	return wrap(ctx, tx, "delete the limit's rows", queries.DeleteKey(ctx, tx, gen.DeleteKeyParams{Name: []byte(k.Name), Key: []byte(k.Key)}))
}

// minTime and maxTime bound what DATETIME(6) holds.
var (
	minTime = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

// checkTime refuses an instant DATETIME(6) cannot hold, before anything is
// written with it: a strict sql_mode would refuse it too, a lax one would
// store a zero date.
func checkTime(what string, t time.Time) error {
	if t.Before(minTime) || t.After(maxTime) {
		return fmt.Errorf("txlimit/mysqlstore: %s reads %v, outside the years 1000 to 9999 that a DATETIME(6) column holds; nothing was written",
			what, t.UTC())
	}
	return nil
}

// checkUTC refuses times that the driver did not read as UTC: the store
// writes and reads every time in UTC, and a DSN with loc set to another zone
// shifts what it reads by that zone's offset (and what it writes back).
func checkUTC(ts ...time.Time) error {
	for _, t := range ts {
		if t.Location() != time.UTC {
			return fmt.Errorf("%w: remove loc from the DSN (or set loc=UTC): the driver read a DATETIME in %v, and the store "+
				"keeps every time in UTC", ErrDSN, t.Location())
		}
	}
	return nil
}
