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
	// exist, each with the given initial (full) state, in ascending shard
	// order, without waiting on rows that exist.
	InsertShards(ctx context.Context, tx TTx, p InsertParams) error

	// TryLockShard locks the first row of (Name, Key) in Order that no
	// other transaction holds, without waiting, and returns it; ok is false
	// when every listed row is held or missing. The lock is taken inside a
	// savepoint the Limiter later ends with KeepTry or UndoTry, so that a
	// lock it does not use can be let go.
	TryLockShard(ctx context.Context, tx TTx, p TryLockParams) (row ShardRow, now time.Time, ok bool, err error)
	// KeepTry writes rows (as WriteShards) and releases the savepoint of
	// TryLockShard, keeping its lock.
	KeepTry(ctx context.Context, tx TTx, rows []ShardWrite) error
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

// TryLockParams lists, in order of preference, the shards TryLockShard may
// take.
type TryLockParams struct {
	Name  string
	Key   string
	Order []int32
	Now   *time.Time
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
