// Package sqlitestore is the SQLite store of txlimit, on database/sql.
//
// It imports no SQLite driver: the application opens its *sql.DB with the
// driver it already uses and passes it to New. With the pure-Go
// modernc.org/sqlite driver (driver name "sqlite"):
//
//	db, err := sql.Open("sqlite",
//		"file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//	…
//	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil { … }
//	limiter, err := txlimit.New(sqlitestore.New(db), limits, nil)
//
// The limiter's TTx is then *sql.Tx, and LimitTx takes the transaction the
// application already has open.
//
// # What to configure, and why
//
// SQLite has one writer at a time and no row locks. To consume a limit, a
// transaction takes the database's write lock before it reads the limit's
// rows, and keeps it until it commits or rolls back; every other writer,
// whatever it writes, waits meanwhile. That is what makes two transactions
// unable to both read the old value and both spend it. The DSN above sets
// three things for that to work under concurrency:
//
//   - busy_timeout(5000): a connection that finds the write lock taken waits
//     for it, up to 5 s, instead of failing at once with SQLITE_BUSY
//     ("database is locked"). Without it a LimitTx fails whenever another
//     transaction holds the lock. Raise it if transactions that hold the lock can be long, or if
//     many writers queue (SQLite's busy handler polls; it is not a fair
//     queue).
//   - journal_mode(WAL): readers (Check, Value, the application's own
//     SELECTs) do not block the writer and the writer does not block them.
//     In the default rollback-journal mode a reader can make a writer's
//     COMMIT wait or fail.
//   - _txlock=immediate: every transaction begun with db.BeginTx runs BEGIN
//     IMMEDIATE, which takes the write lock at BEGIN, waiting under
//     busy_timeout. With a deferred BEGIN (the default of database/sql
//     drivers), a transaction that reads before it writes (the
//     application's own queries, or a CheckTx or ValueTx before a
//     LimitTx) holds a read snapshot, and SQLite cannot let it wait for
//     the write lock: if another connection holds the lock, or has
//     committed since the snapshot, the upgrade fails at once with
//     SQLITE_BUSY or SQLITE_BUSY_SNAPSHOT, whatever busy_timeout says. The
//     store takes the write lock before it reads the rows it will write, so
//     a transaction whose first statement is the store's waits properly
//     even when deferred; only immediate transactions make every
//     transaction safe. A transaction that should not take the write lock
//     (a page that only calls CheckTx or ValueTx) can be begun with
//     &sql.TxOptions{ReadOnly: true}, for which modernc.org/sqlite issues a
//     plain BEGIN even under _txlock=immediate.
//
// With github.com/mattn/go-sqlite3 the same settings are
// "file:app.db?_busy_timeout=5000&_journal_mode=WAL&_txlock=immediate".
//
// One connection writes at a time. db.SetMaxOpenConns need not be 1: the
// other writers wait for the write lock, each up to busy_timeout (SQLite's
// busy handler polls, so that wait is not first come, first served). A
// smaller pool moves the queue into database/sql, where a writer waits as
// long as its context allows. Every connection of the pool needs the
// settings, which is why they belong in the DSN rather than in a PRAGMA
// statement run once.
//
// Use a database file. ":memory:" gives every connection of the pool its own
// empty database.
//
// # Errors
//
// SQLITE_BUSY ("database is locked") and every other database error is
// returned as an error, wrapped so that errors.As still reaches the driver's
// error type; it is never turned into a denial or a grant. After an error,
// roll the transaction back (part of what the call meant to write may be in
// it) and, for SQLITE_BUSY, run the whole transaction again.
//
// # Clock
//
// SQLite has no server clock. The store reads the clock of the process,
// time.Now truncated to microseconds, after it has taken the write lock, so
// that the transactions that consume a limit read the clock in the order in
// which they write it. A txlimit.Options.Clock replaces it. Processes that
// share a database file share a machine, and with it a clock; a clock that
// steps backwards never adds tokens.
//
// # Shards
//
// Shards spread a limit over several rows so that PostgreSQL transactions do
// not queue on one row lock. SQLite locks the whole database, so they do not
// add concurrency here: SkipsLocked reports false and the Limiter locks every
// shard of a limit. A sharded limit still admits exactly what the same
// unsharded limit would.
package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txlimit/txlimit"
	gen "github.com/txlimit/txlimit/sqlitestore/internal/db"
)

// Store implements txlimit.Store for database/sql on SQLite.
type Store struct {
	db      *sql.DB
	queries *gen.Queries
	stmts   *stmtCache // nil when db is
}

var _ txlimit.Store[*sql.Tx] = (*Store)(nil)

// New returns a store on db, opened with any SQLite driver and configured as
// the package documentation says. db may be nil when only the …Tx forms of
// the limiter are used; the other forms then return txlimit.ErrNoPool.
//
// In WAL mode the store prepares its statements on db the first time it
// runs them (in the background, on a connection of the pool, once per
// Store: make one Store per *sql.DB and share it) and from then on runs them
// prepared in the caller's transaction, so that SQLite does not compile the
// same SQL again, under the write lock, on every call. Preparing takes a
// connection of the pool that no transaction holds: while every connection
// is held (SetMaxOpenConns(1) and a transaction open, say), the calls run the
// text until one is free. The statements are closed with db. A transaction
// of another *sql.DB, one that comes before a statement is ready, and every
// transaction on a database in another journal mode run the SQL text as it
// is.
func New(db *sql.DB) *Store {
	s := &Store{db: db, queries: gen.New()}
	if db != nil {
		s.stmts = &stmtCache{db: db}
	}
	return s
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("txlimit/sqlitestore: %s: %w", op, err)
}

// clock returns now, or the process clock when now is nil, at microsecond
// precision (the precision of the stored ts).
func clock(now *time.Time) time.Time {
	if now != nil {
		return time.UnixMicro(now.UnixMicro())
	}
	return time.UnixMicro(time.Now().UnixMicro())
}

// InTx implements txlimit.Store. A transaction that will write is begun
// with default options, so the DSN's _txlock decides whether it is
// IMMEDIATE; one that only reads (Check, Value) is begun read-only, which
// modernc.org/sqlite begins without taking the write lock. It is rolled back
// when fn returns an error or panics (the panic then continues) and
// committed otherwise.
func (s *Store) InTx(ctx context.Context, readOnly bool, fn func(tx *sql.Tx) error) error {
	if s.db == nil {
		return txlimit.ErrNoPool
	}
	var opts *sql.TxOptions
	if readOnly {
		opts = &sql.TxOptions{ReadOnly: true}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return wrap("begin", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	done = true
	return wrap("commit", tx.Commit())
}

// SkipsLocked implements txlimit.Store: SQLite has one writer at a time and
// no row locks to skip.
func (s *Store) SkipsLocked() bool { return false }

// lock takes SQLite's write lock for tx, waiting up to busy_timeout; it is a
// no-op when tx holds it already.
func (s *Store) lock(ctx context.Context, tx *sql.Tx, name, key string) error {
	return wrap("take the write lock", s.queries.TouchKey(ctx, s.on(tx), gen.TouchKeyParams{Name: name, Key: key}))
}

func shardRow(shard int64, value float64, ts int64) txlimit.ShardRow {
	return txlimit.ShardRow{Shard: int32(shard), Value: value, TS: time.UnixMicro(ts)}
}

// LockShards implements txlimit.Store: it takes the write lock, which locks
// every row of the database, then reads the rows of (Name, Key) and the
// clock. The clock is returned even when there is no row.
func (s *Store) LockShards(ctx context.Context, tx *sql.Tx, p txlimit.KeyParams) ([]txlimit.ShardRow, time.Time, error) {
	if err := s.lock(ctx, tx, p.Name, p.Key); err != nil {
		return nil, time.Time{}, err
	}
	s.stmts.learnMode(ctx, tx)
	rows, err := s.queries.LockShards(ctx, s.on(tx), gen.LockShardsParams{Name: p.Name, Key: p.Key})
	if err != nil {
		return nil, time.Time{}, wrap("lock shards", err)
	}
	var out []txlimit.ShardRow
	for _, r := range rows {
		out = append(out, shardRow(r.Shard, r.Value, r.Ts))
	}
	return out, clock(p.Now), nil
}

// InsertShards implements txlimit.Store, one INSERT … ON CONFLICT DO NOTHING
// per shard in ascending order, all under the write lock the first one
// takes (or the transaction holds already), which locks every row.
func (s *Store) InsertShards(ctx context.Context, tx *sql.Tx, p txlimit.InsertParams) error {
	_, err := s.insertShards(ctx, tx, p)
	return err
}

// insertShards is InsertShards, returning the rows it created.
func (s *Store) insertShards(ctx context.Context, tx *sql.Tx, p txlimit.InsertParams) ([]txlimit.ShardKey, error) {
	ts := p.TS.UnixMicro()
	var created []txlimit.ShardKey
	for shard := range int64(max(p.Shards, 0)) {
		n, err := s.queries.InsertShard(ctx, s.on(tx), gen.InsertShardParams{
			Name: p.Name, Key: p.Key, Shard: shard, Value: p.Value, Ts: ts,
		})
		if err != nil {
			return nil, wrap("insert shards", err)
		}
		if n > 0 {
			created = append(created, txlimit.ShardKey{Name: p.Name, Key: p.Key, Shard: int32(shard)})
		}
	}
	return created, nil
}

// TryLockShard implements txlimit.Store for completeness; the Limiter does
// not call it, since SkipsLocked is false. SQLite cannot skip what another
// transaction holds, so it waits for the write lock like LockShards and
// returns the first row that exists going up from p.Start, then on from
// shard 0 (Locked is false when the key has none). The lock cannot be given
// back before the transaction ends: UndoTry leaves it held, which is always
// correct, only not concurrent.
func (s *Store) TryLockShard(ctx context.Context, tx *sql.Tx, p txlimit.TryLockParams) (txlimit.TryLockResult, error) {
	rows, now, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return txlimit.TryLockResult{}, err
	}
	out := txlimit.TryLockResult{All: rows, Now: now}
	if len(rows) > 0 {
		// rows are in shard order: the first at or after Start, else the
		// first of all.
		i, _ := slices.BinarySearchFunc(rows, p.Start, compareShard)
		out.Row, out.Locked = rows[i%len(rows)], true
	}
	return out, nil
}

func compareShard(r txlimit.ShardRow, shard int32) int { return cmp.Compare(r.Shard, shard) }

// KeepTry implements txlimit.Store: it writes rows as WriteShards does.
// TryLockShard opened no savepoint, so there is nothing to release.
func (s *Store) KeepTry(ctx context.Context, tx *sql.Tx, rows []txlimit.ShardWrite) error {
	return s.WriteShards(ctx, tx, rows)
}

// WaitShard implements txlimit.Store for completeness, like TryLockShard:
// it takes the write lock and returns the row when it exists.
func (s *Store) WaitShard(ctx context.Context, tx *sql.Tx, p txlimit.WaitShardParams) (txlimit.TryLockResult, error) {
	rows, now, err := s.LockShards(ctx, tx, txlimit.KeyParams{Name: p.Name, Key: p.Key, Now: p.Now})
	if err != nil {
		return txlimit.TryLockResult{}, err
	}
	out := txlimit.TryLockResult{Now: now}
	if i, found := slices.BinarySearchFunc(rows, p.Shard, compareShard); found {
		out.Row, out.Locked = rows[i], true
	}
	return out, nil
}

// UndoTry implements txlimit.Store. TryLockShard wrote nothing, so there is
// nothing to undo, and SQLite's write lock is held until the transaction
// ends whatever UndoTry does: it does nothing.
func (s *Store) UndoTry(ctx context.Context, tx *sql.Tx) error { return nil }

// ReadShards implements txlimit.Store with a plain SELECT, which takes no
// write lock: it sees tx's snapshot (and tx's own writes).
func (s *Store) ReadShards(ctx context.Context, tx *sql.Tx, p txlimit.KeyParams) ([]txlimit.ShardRow, time.Time, error) {
	rows, err := s.queries.ReadShards(ctx, s.on(tx), gen.ReadShardsParams{Name: p.Name, Key: p.Key})
	if err != nil {
		return nil, time.Time{}, wrap("read shards", err)
	}
	var out []txlimit.ShardRow
	for _, r := range rows {
		out = append(out, shardRow(r.Shard, r.Value, r.Ts))
	}
	return out, clock(p.Now), nil
}

// WriteShards implements txlimit.Store, one UPDATE per row.
func (s *Store) WriteShards(ctx context.Context, tx *sql.Tx, rows []txlimit.ShardWrite) error {
	for _, r := range rows {
		err := s.queries.WriteShard(ctx, s.on(tx), gen.WriteShardParams{
			Name: r.Name, Key: r.Key, Shard: int64(r.Shard), Value: r.Value, Ts: r.TS.UnixMicro(),
		})
		if err != nil {
			return wrap("write shards", err)
		}
	}
	return nil
}

// DeleteKey implements txlimit.Store.
func (s *Store) DeleteKey(ctx context.Context, tx *sql.Tx, name, key string) error {
	return wrap("delete key", s.queries.DeleteKey(ctx, s.on(tx), gen.DeleteKeyParams{Name: name, Key: key}))
}

// LockKeys implements txlimit.Store. The write lock locks every row at once,
// so the order does not matter here; the keys are still gone through in the
// canonical order, each one as InsertShards and LockShards do.
func (s *Store) LockKeys(ctx context.Context, tx *sql.Tx, p txlimit.LockKeysParams) (txlimit.LockedKeys, error) {
	out := txlimit.LockedKeys{Rows: make([][]txlimit.ShardRow, len(p.Keys))}
	order := make([]int, len(p.Keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ka, kb := p.Keys[a], p.Keys[b]
		if c := strings.Compare(ka.Name, kb.Name); c != 0 {
			return c
		}
		return strings.Compare(ka.Key, kb.Key)
	})
	for _, i := range order {
		k := p.Keys[i]
		if err := s.lock(ctx, tx, k.Name, k.Key); err != nil {
			return txlimit.LockedKeys{}, err
		}
		created, err := s.insertShards(ctx, tx, k)
		if err != nil {
			return txlimit.LockedKeys{}, err
		}
		out.Created = append(out.Created, created...)
		rows, err := s.queries.LockShards(ctx, s.on(tx), gen.LockShardsParams{Name: k.Name, Key: k.Key})
		if err != nil {
			return txlimit.LockedKeys{}, wrap("lock keys", err)
		}
		for _, r := range rows {
			if r.Shard < int64(k.Shards) {
				out.Rows[i] = append(out.Rows[i], shardRow(r.Shard, r.Value, r.Ts))
			}
		}
	}
	out.Now = clock(p.Now)
	return out, nil
}

// DeleteShards implements txlimit.Store, one DELETE per row.
func (s *Store) DeleteShards(ctx context.Context, tx *sql.Tx, rows []txlimit.ShardKey) (int, error) {
	deleted := 0
	for _, r := range rows {
		n, err := s.queries.DeleteShard(ctx, s.on(tx), gen.DeleteShardParams{Name: r.Name, Key: r.Key, Shard: int64(r.Shard)})
		if err != nil {
			return deleted, wrap("delete shards", err)
		}
		deleted += int(n)
	}
	return deleted, nil
}

// ScanKeys implements txlimit.Store, in primary-key order (SQLite's BINARY
// collation: byte by byte).
func (s *Store) ScanKeys(ctx context.Context, tx *sql.Tx, p txlimit.ScanKeysParams) ([]txlimit.KeyRef, error) {
	rows, err := s.queries.ScanKeys(ctx, s.on(tx), gen.ScanKeysParams{AfterName: p.AfterName, AfterKey: p.AfterKey, MaxKeys: int64(p.Max)})
	if err != nil {
		return nil, wrap("scan keys", err)
	}
	out := make([]txlimit.KeyRef, len(rows))
	for i, r := range rows {
		out[i] = txlimit.KeyRef{Name: r.Name, Key: r.Key}
	}
	return out, nil
}

// LockIdle implements txlimit.Store. SQLite cannot pass over rows that
// another transaction holds: it takes the write lock, waiting up to
// busy_timeout like every writer, and then holds every row, so each key's
// Total is the number of its rows. The rows of all the keys are read in one
// range scan of the primary key, from the first key to the last.
func (s *Store) LockIdle(ctx context.Context, tx *sql.Tx, keys []txlimit.KeyRef, now *time.Time) ([]txlimit.IdleKey, time.Time, error) {
	if len(keys) == 0 {
		return nil, clock(now), nil
	}
	first, last := keys[0], keys[len(keys)-1]
	if err := s.lock(ctx, tx, first.Name, first.Key); err != nil {
		return nil, time.Time{}, err
	}
	rows, err := s.queries.RowsBetween(ctx, s.on(tx), gen.RowsBetweenParams{
		FirstName: first.Name, FirstKey: first.Key, LastName: last.Name, LastKey: last.Key,
	})
	if err != nil {
		return nil, time.Time{}, wrap("lock idle", err)
	}
	wanted := make(map[txlimit.KeyRef]bool, len(keys))
	for _, k := range keys {
		wanted[k] = true
	}
	var out []txlimit.IdleKey
	for _, r := range rows {
		if !wanted[txlimit.KeyRef{Name: r.Name, Key: r.Key}] {
			continue
		}
		if len(out) == 0 || out[len(out)-1].Name != r.Name || out[len(out)-1].Key != r.Key {
			out = append(out, txlimit.IdleKey{Name: r.Name, Key: r.Key})
		}
		last := &out[len(out)-1]
		last.Rows = append(last.Rows, shardRow(r.Shard, r.Value, r.Ts))
		last.Total++
	}
	return out, clock(now), nil
}
