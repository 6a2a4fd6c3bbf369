package txlimit

import (
	"context"
	"time"
)

// Store is the seam between the Limiter and one database. pgstore and
// sqlitestore implement it; its methods move rows and nothing else, all
// decisions are made by the Limiter.
//
// Store is not a stable API: it may change in any release. Do not implement
// it outside this module; construct one with pgstore.New or sqlitestore.New.
type Store[TTx any] interface {
	// InTx runs fn in a new short transaction on the store's pool or
	// database and commits it when fn returns nil, rolling back otherwise.
	// readOnly is set for operations that only read (Check, Value), so that
	// a store may begin a transaction that takes no write lock. It returns
	// ErrNoPool when the store was built without a pool.
	InTx(ctx context.Context, readOnly bool, fn func(tx TTx) error) error

	// LockShards locks every existing row of (Name, Key), waiting for other
	// transactions, in ascending shard order, and returns them in that
	// order with the clock. Rows that do not exist are not created.
	LockShards(ctx context.Context, tx TTx, p KeyParams) ([]ShardRow, time.Time, error)

	// InsertShards creates the rows 0..Shards-1 of (Name, Key) that do not
	// exist, each with the given initial (full) state, and locks the ones
	// that do, going through the rows in ascending shard order and waiting
	// for rows other transactions hold. Taking every lock of a key in shard
	// order is what keeps two transactions from deadlocking on it.
	InsertShards(ctx context.Context, tx TTx, p InsertParams) error

	// TryLockShard locks the first row of (Name, Key) that no other
	// transaction holds, without waiting, going up from shard Start and
	// then on from shard 0, and, when ReadAll is set, reads every row of
	// (Name, Key) without locking them, as ReadShards does, in the same
	// round trip. Locked is false when every row is held or missing. The
	// lock is taken inside a savepoint the Limiter later ends with KeepTry
	// or UndoTry, so that a lock it does not use can be let go.
	TryLockShard(ctx context.Context, tx TTx, p TryLockParams) (TryLockResult, error)
	// KeepTry writes rows (as WriteShards) and releases the savepoint of
	// TryLockShard, keeping its lock.
	KeepTry(ctx context.Context, tx TTx, rows []ShardWrite) error
	// WaitShard locks one row of (Name, Key), waiting for the transaction
	// that holds it, inside the savepoint of a TryLockShard that found every
	// row held; KeepTry or UndoTry then end it. Locked is false when the
	// row does not exist.
	WaitShard(ctx context.Context, tx TTx, p WaitShardParams) (TryLockResult, error)
	// UndoTry rolls back to before TryLockShard, releasing its lock.
	UndoTry(ctx context.Context, tx TTx) error

	// ReadShards returns the rows of (Name, Key) as the transaction sees
	// them (what others committed, plus its own writes) without locking
	// anything, and the clock.
	ReadShards(ctx context.Context, tx TTx, p KeyParams) ([]ShardRow, time.Time, error)

	// WriteShards stores new state for rows that the transaction holds.
	WriteShards(ctx context.Context, tx TTx, rows []ShardWrite) error

	// DeleteKey deletes every row of (Name, Key).
	DeleteKey(ctx context.Context, tx TTx, name, key string) error

	// LockKeys is the lock of LimitAll: it creates the missing rows
	// 0..Shards-1 of every key in p.Keys with the given initial (full)
	// state and locks all of them, waiting for rows other transactions
	// hold, in one canonical order whatever the order of p.Keys: by name,
	// then key, both compared byte by byte, then shard. It returns the rows
	// 0..Shards-1 of each key (in p.Keys' order, each in shard order), the
	// rows it created, and the clock, read once every lock is held.
	LockKeys(ctx context.Context, tx TTx, p LockKeysParams) (LockedKeys, error)

	// DeleteShards deletes the listed rows, which the transaction holds,
	// and returns how many it deleted.
	DeleteShards(ctx context.Context, tx TTx, rows []ShardKey) (int, error)

	// ScanKeys returns up to Max (name, key) pairs that have rows, the
	// first ones after (AfterName, AfterKey) in the store's own order
	// (where ("", "") comes before every pair), without locking anything.
	ScanKeys(ctx context.Context, tx TTx, p ScanKeysParams) ([]KeyRef, error)

	// LockIdle locks the rows of keys (pairs ScanKeys returned, in its
	// order) that no other transaction holds, without ever waiting, and
	// returns them per key with the number of rows the key has in all
	// (locked or not), and the clock. Keys whose rows are all held
	// elsewhere may be missing from the result.
	LockIdle(ctx context.Context, tx TTx, keys []KeyRef, now *time.Time) ([]IdleKey, time.Time, error)

	// SkipsLocked reports whether TryLockShard can pass over rows that
	// other transactions hold. A store whose database has one writer at a
	// time (SQLite) returns false, and the Limiter then always locks every
	// shard of a limit.
	SkipsLocked() bool
}

// KeyParams names the rows of one (name, key). Now, when not nil, replaces
// the database clock.
type KeyParams struct {
	Name string
	Key  string
	Now  *time.Time
}

// InsertParams describes the rows to create for a (name, key).
type InsertParams struct {
	Name   string
	Key    string
	Shards int32
	Value  float64
	TS     time.Time
}

// TryLockParams names the key whose shards TryLockShard may take and the
// shard it tries first.
type TryLockParams struct {
	Name string
	Key  string
	// Start is the first shard tried; the rows after it come next, then
	// the rows from shard 0 up to it.
	Start int32
	Now   *time.Time
	// ReadAll asks for every row of the key too (TryLockResult.All).
	ReadAll bool
}

// WaitShardParams names the row WaitShard waits for.
type WaitShardParams struct {
	Name  string
	Key   string
	Shard int32
	Now   *time.Time
}

// TryLockResult is what TryLockShard or WaitShard found.
type TryLockResult struct {
	// Row is the row it locked, when Locked.
	Row    ShardRow
	Locked bool
	// All is, when TryLockParams.ReadAll was set, every row of the key as
	// last committed, as ReadShards returns them. The locked row may be
	// newer in Row than in All (a commit between the read and the lock).
	All []ShardRow
	// Now is the clock. It may be zero when nothing was locked or read.
	Now time.Time
}

// LockKeysParams lists the keys of one LimitAll call. Keys must not hold
// the same (Name, Key) twice.
type LockKeysParams struct {
	Keys []InsertParams
	Now  *time.Time
}

// LockedKeys is what LockKeys locked.
type LockedKeys struct {
	// Rows holds, for each key of LockKeysParams.Keys in that order, its
	// rows 0..Shards-1 in shard order.
	Rows [][]ShardRow
	// Created lists the rows LockKeys inserted.
	Created []ShardKey
	Now     time.Time
}

// ShardKey names one row.
type ShardKey struct {
	Name  string
	Key   string
	Shard int32
}

// KeyRef names a (name, key).
type KeyRef struct {
	Name string
	Key  string
}

// ScanKeysParams is a page of ScanKeys.
type ScanKeysParams struct {
	AfterName string
	AfterKey  string
	Max       int
}

// IdleKey is a key whose rows LockIdle locked.
type IdleKey struct {
	Name string
	Key  string
	// Rows are the rows this transaction locked, in shard order.
	Rows []ShardRow
	// Total is the number of rows the key has, including rows other
	// transactions hold.
	Total int
}

// ShardRow is one stored row.
type ShardRow struct {
	Shard int32
	Value float64
	TS    time.Time
}

// ShardWrite is the new state of one row.
type ShardWrite struct {
	Name  string
	Key   string
	Shard int32
	Value float64
	TS    time.Time
}
