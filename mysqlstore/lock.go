package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
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
		full := l.Full()
		for sh := range l.Shards {
			rows = append(rows, put(l, int32(sh), full))
		}
	}
	_, err := execList(ctx, tx, ensureRowsSQL, "create and lock the limit's rows", rows)
	return err
}

// execList runs query, a statement of rows.sql, on list, and returns the
// number of rows it changed.
func execList(ctx context.Context, tx *sql.Tx, query, op string, list any) (int64, error) {
	arg, err := json.Marshal(list)
	if err != nil {
		return 0, err
	}
	r, err := tx.ExecContext(ctx, query, arg)
	if err != nil {
		return 0, wrap(ctx, tx, op, err)
	}
	n, err := r.RowsAffected()
	return n, wrap(ctx, tx, op, err)
}

// put is the row that stores state s of shard of l. Row 0 of a sharded
// limit carries the number of shards in Prev, which algo reads for the
// sliding window alone (its previous window's count, left as it is):
// takerow's one statement takes only a row whose prev is 0, so a key a
// sharded config wrote goes to the locked path, which pools its rows (a
// redeployed Shards), and the statement that may create row 0 never reads
// the others (which would lock the gap after it).
func put(l driver.Limit, shard int32, s algo.State) rowWrite {
	if shard == 0 && l.Shards > 1 && l.Config.Kind != algo.SlidingWindow {
		s.Prev = float64(l.Shards)
	}
	return rowWrite{name: l.Name, key: l.Key, shard: shard, state: s}
}

// isPlaceholder reports whether r is exactly a row ensure created for l:
// full and without a pause, the same as no row (no write stamps the full
// state's time, years before any clock). The locked path counts it as
// missing, so that a key with fewer rows than l's Shards is resharded
// rather than taken as l's.
func isPlaceholder(l driver.Limit, r driver.Row) bool {
	full := put(l, r.Shard, l.Full()).state
	return r.Value == full.Value && r.Prev == full.Prev && r.TS.UnixMicro() == full.TS && r.Paused.IsZero()
}

// pausedOf is the pause of a row read with its paused_until.
func pausedOf(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

// shards is from..to-1.
func shards(from, to int) []int32 {
	out := make([]int32, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, int32(i))
	}
	return out
}

// LockKey creates the missing rows of shards 0..Shards-1 whatever create
// says (ensure: InnoDB locks a missing row only by creating it, or with a
// gap lock), locks every row of l's key in shard order, another config's
// beyond Shards-1 last, and reads them with the clock, read once they are
// held. The placeholders it holds are Created.
func (s *backend) LockKey(ctx context.Context, tx *sql.Tx, l driver.Limit, now *time.Time, _ bool) (engine.Locked, error) {
	if err := ensure(ctx, tx, l); err != nil {
		return engine.Locked{}, err
	}
	rows, err := queries.LockShards(ctx, tx, gen.LockShardsParams{Name: []byte(l.Name), Key: []byte(l.Key), Shards: shards(0, l.Shards)})
	if err != nil {
		return engine.Locked{}, wrap(ctx, tx, "lock the limit's rows", err)
	}
	if len(rows) == 0 {
		return engine.Locked{}, fmt.Errorf("txlimit/mysqlstore: lock the limit's rows: none found after creating them")
	}
	if top := rows[0].Top; top >= int64(l.Shards) {
		more, err := queries.LockShards(ctx, tx, gen.LockShardsParams{Name: []byte(l.Name), Key: []byte(l.Key), Shards: shards(l.Shards, int(top)+1)})
		if err != nil {
			return engine.Locked{}, wrap(ctx, tx, "lock the rows of another config's shards", err)
		}
		rows = append(rows, more...)
	}
	all := make([]driver.Row, len(rows))
	for i, r := range rows {
		all[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: pausedOf(r.PausedUntil)}
		if err := checkUTC(r.Ts, r.Clock); err != nil {
			return engine.Locked{}, err
		}
	}
	return held(l, all, clockOr(now, rows[0].Clock)), nil
}

// held is what the transaction holds of l's key, rows: the placeholders of
// shards 0..Shards-1 (created by ensure, now or by a call that wrote none)
// Created, the others Had.
func held(l driver.Limit, rows []driver.Row, at time.Time) engine.Locked {
	out := engine.Locked{At: at}
	for _, r := range rows {
		if int(r.Shard) < l.Shards && isPlaceholder(l, r) {
			out.Created = append(out.Created, r.Shard)
		} else {
			out.Had = append(out.Had, r)
		}
	}
	return out
}

// clockOr is the call's own clock, now, or the server's when now is nil.
// txlimit refuses a now that DATETIME(6) cannot hold (ClockRange) before any
// statement, and write refuses a state that it cannot.
func clockOr(now *time.Time, server time.Time) time.Time {
	if now != nil {
		return time.UnixMicro(now.UnixMicro()).UTC()
	}
	return server
}

// rowWrite is the new state of one row, and its pause (zero: none).
type rowWrite struct {
	name, key string
	shard     int32
	state     algo.State
	paused    time.Time
}

func (w rowWrite) MarshalJSON() ([]byte, error) {
	if err := checkTime("a limit's state", time.UnixMicro(w.state.TS)); err != nil {
		return nil, err
	}
	// A DATETIME(6) literal in UTC, and the shortest decimals that read back
	// as the same float64s.
	ts := datetime(time.UnixMicro(w.state.TS))
	value, prev := strconv.FormatFloat(w.state.Value, 'g', -1, 64), strconv.FormatFloat(w.state.Prev, 'g', -1, 64)
	return json.Marshal([]any{hexOf(w.name), hexOf(w.key), w.shard, value, ts, prev, datetime(w.paused)})
}

// datetime is t as a DATETIME(6) literal in UTC, "" for the zero time.
func datetime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000000")
}

// jsonRef is a key, or with a shard one of its rows, in the JSON lists of
// rows.sql.
func jsonRef(k driver.KeyRef, shard ...int32) []any {
	out := []any{hexOf(k.Name), hexOf(k.Key)}
	for _, sh := range shard {
		out = append(out, sh)
	}
	return out
}

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// Write stores the states of every KeyWrite in one statement (write), whose
// rows ensure created, and deletes the rows of deletes in another.
func (s *backend) Write(ctx context.Context, tx *sql.Tx, writes []engine.KeyWrite, deletes []engine.RowRef) (int64, error) {
	var ws []rowWrite
	for _, w := range writes {
		for i, st := range w.States {
			rw := put(w.Limit, int32(i), st)
			rw.paused = w.Paused
			ws = append(ws, rw)
		}
	}
	if err := write(ctx, tx, ws); err != nil {
		return 0, err
	}
	return deleteRows(ctx, tx, deletes)
}

// write stores writes: WriteShard for a single row, WriteRows for more, none
// for an empty list.
func write(ctx context.Context, tx *sql.Tx, writes []rowWrite) error {
	switch len(writes) {
	case 0:
		return nil
	case 1:
		w := writes[0]
		if err := checkTime("a limit's state", time.UnixMicro(w.state.TS)); err != nil {
			return err
		}
		return wrap(ctx, tx, "write the limit's rows", queries.WriteShard(ctx, tx, gen.WriteShardParams{
			Value: w.state.Value, Prev: w.state.Prev, Ts: time.UnixMicro(w.state.TS).UTC(),
			PausedUntil: sql.NullTime{Time: w.paused.UTC(), Valid: !w.paused.IsZero()},
			Name:        []byte(w.name), Key: []byte(w.key), Shard: w.shard,
		}))
	}
	_, err := execList(ctx, tx, writeRowsSQL, "write the limit's rows", writes)
	return err
}

// deleteRows deletes rows, which tx holds: DeleteShards when they are of
// one key (the rows a call created and then wrote none of), DeleteRows
// otherwise.
func deleteRows(ctx context.Context, tx *sql.Tx, rows []engine.RowRef) (int64, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	list := make([][]any, len(rows))
	var ofKey []int32
	for i, r := range rows {
		list[i] = jsonRef(r.KeyRef, r.Shard)
		if r.KeyRef == rows[0].KeyRef {
			ofKey = append(ofKey, r.Shard)
		}
	}
	if len(ofKey) == len(rows) {
		n, err := queries.DeleteShards(ctx, tx, gen.DeleteShardsParams{Name: []byte(rows[0].Name), Key: []byte(rows[0].Key), Shards: ofKey})
		return n, wrap(ctx, tx, "delete rows", err)
	}
	return execList(ctx, tx, deleteRowsSQL, "delete rows", list)
}

// TryShard runs TryLockShard on each shard of order (which the snapshot
// says exist: the engine read them first) until one is not held elsewhere.
func (s *backend) TryShard(ctx context.Context, tx *sql.Tx, p driver.TakeParams, order []int32) (engine.Tried, error) {
	for _, sh := range order {
		r, err := queries.TryLockShard(ctx, tx, gen.TryLockShardParams{Name: []byte(p.Name), Key: []byte(p.Key), Shard: sh})
		if errors.Is(err, sql.ErrNoRows) {
			continue // another transaction holds it
		}
		if err != nil {
			return engine.Tried{}, wrap(ctx, tx, "lock a shard", err)
		}
		if err := checkUTC(r.Ts, r.Clock); err != nil {
			return engine.Tried{}, err
		}
		return engine.Tried{Row: driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: pausedOf(r.PausedUntil)}, Locked: true,
			Top: int32(p.Shards - 1), Now: clockOr(p.Now, r.Clock)}, nil
	}
	return engine.Tried{}, nil
}

// KeepShards writes rows, which stay locked until the transaction ends, as
// every InnoDB row lock does.
func (s *backend) KeepShards(ctx context.Context, tx *sql.Tx, l driver.Limit, rows []driver.Row) error {
	ws := make([]rowWrite, len(rows))
	for i, r := range rows {
		ws[i] = put(l, r.Shard, r.State())
	}
	return write(ctx, tx, ws)
}

// TryShards implements engine.FreeLocker with TryLockShards.
func (s *backend) TryShards(ctx context.Context, tx *sql.Tx, p driver.TakeParams, shards []int32) ([]driver.Row, error) {
	free, err := queries.TryLockShards(ctx, tx, gen.TryLockShardsParams{Name: []byte(p.Name), Key: []byte(p.Key), Shards: shards})
	if err != nil {
		return nil, wrap(ctx, tx, "lock the free shards", err)
	}
	rows := make([]driver.Row, len(free))
	for i, r := range free {
		rows[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: pausedOf(r.PausedUntil)}
	}
	return rows, nil
}

// Read reads with plain reads, which lock nothing: the transaction's
// snapshot, and its own writes.
func (s *backend) Read(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	rows, err := queries.ReadShards(ctx, tx, gen.ReadShardsParams{Name: []byte(p.Name), Key: []byte(p.Key)})
	if err != nil {
		return driver.ReadResult{}, wrap(ctx, tx, "read the limit's rows", err)
	}
	out := driver.ReadResult{Rows: make([]driver.Row, len(rows))}
	for i, r := range rows {
		out.Rows[i] = driver.Row{Shard: r.Shard, Value: r.Value, Prev: r.Prev, TS: r.Ts, Paused: pausedOf(r.PausedUntil)}
		if err := checkUTC(r.Ts); err != nil {
			return driver.ReadResult{}, err
		}
	}
	if p.Now != nil {
		out.At = clockOr(p.Now, time.Time{})
		return out, nil
	}
	out.At, err = queries.Clock(ctx, tx)
	if err != nil {
		return driver.ReadResult{}, wrap(ctx, tx, "read the clock", err)
	}
	return out, checkUTC(out.At)
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
			return dsnError("remove loc from the DSN (or set loc=UTC): the driver read a DATETIME in %v, and the store "+
				"keeps every time in UTC", t.Location())
		}
	}
	return nil
}
