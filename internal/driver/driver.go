// Package driver is the seam between txlimit's Limiter and a database: the
// Ops interface every store implements, the parameters of its operations,
// and the pure decisions on a store's rows that package engine makes. The
// Limiter makes no choice that depends on the database. The seam is
// sealed: the package is internal, and the Store that txlimit.New takes
// has an unexported method, which a type gets only by embedding a Handle.
package driver

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"time"

	"github.com/txlimit/txlimit/algo"
)

// ErrNoPool is returned by Ops.InTx when the store was built without a
// pool or database; txlimit turns it into an *InvalidError.
var ErrNoPool = errors.New("txlimit: the store has no pool or database; use the ...Tx forms or pass one to the store's New")

// ErrNotMigrated matches (errors.Is) the error a store returns when the
// txlimit table is missing or lacks a column (txlimit.ErrNotMigrated).
var ErrNotMigrated = errors.New("txlimit: the txlimit table is missing or out of date; run migrations.Up on this database (and schema) before using the limiter")

// ErrSetup matches (errors.Is) the errors of a deployment the store cannot
// work in: another kind of database, a DSN without a setting the store
// needs, a pooler mode the driver's statements do not survive.
// txlimit.Options.FailOpen never grants on them.
var ErrSetup = errors.New("txlimit: the store cannot work in this setup")

// Setup marks err as a mistake of the setup (ErrSetup) without changing its
// text or what else it matches.
func Setup(err error) error {
	if err == nil {
		return nil
	}
	return setupError{err}
}

type setupError struct{ error }

func (e setupError) Unwrap() error        { return e.error }
func (e setupError) Is(target error) bool { return target == ErrSetup }

// ErrCommitUnknown matches (errors.Is) the error of Ops.Commit and
// InTxCommit when the connection failed during the COMMIT
// (txlimit.ErrCommitUnknown).
var ErrCommitUnknown = errors.New("txlimit: the connection failed while COMMIT was under way; the transaction may or may not have committed")

// Store is a store as txlimit.New takes it (pgstore.Store, ...): its method
// is unexported, so that only this module's stores implement it, while
// txlimit.New still infers TTx from it.
type Store[TTx any] interface {
	ops() Ops[TTx]
}

// Handle is what a store's exported type embeds to be a Store.
type Handle[TTx any] struct{ o Ops[TTx] }

// NewHandle is the Handle of o.
func NewHandle[TTx any](o Ops[TTx]) Handle[TTx] { return Handle[TTx]{o} }

func (h Handle[TTx]) ops() Ops[TTx] { return h.o }

// OpsOf is the operations of s.
func OpsOf[TTx any](s Store[TTx]) Ops[TTx] { return s.ops() }

// Ops moves the rows of txlimit's table for one database. TTx is the
// transaction type of its driver (pgx.Tx, *sql.Tx).
type Ops[TTx any] interface {
	// InTx runs fn in a new short transaction on the store's pool, read-only
	// when readOnly, and commits it when fn returns nil, rolling back
	// otherwise. Without a pool it returns ErrNoPool, as do InTxCommit,
	// Prune and Ping.
	InTx(ctx context.Context, readOnly bool, fn func(tx TTx) error) error

	// Take takes p.Count tokens from one limit (Decide, or algo.Take on one shard),
	// writing the new state when it grants. A denial writes nothing a later
	// call could tell from the state before it.
	Take(ctx context.Context, tx TTx, p TakeParams) (TakeResult, error)

	// TakeAll takes from several limits, all or none (DecideAll), locking
	// every row of every limit in the canonical order (name, then key,
	// byte by byte, then shard), so that two callers never deadlock on
	// them. Once one denied, each limit gets the decision Check gives it.
	TakeAll(ctx context.Context, tx TTx, p TakeAllParams) (TakeAllResult, error)

	// Commit takes p's tokens in tx as TakeAll does and ends tx: it commits
	// when every limit granted and rolls back otherwise. A store whose
	// driver pipelines sends one-statement takes with the COMMIT. tx
	// committed if it returns nil and an OK result, may have committed if
	// the error matches ErrCommitUnknown, and did not otherwise.
	Commit(ctx context.Context, tx TTx, p TakeAllParams) (TakeAllResult, error)

	// InTxCommit begins a transaction on the store's pool, runs fn in it
	// and ends it as Commit does; an error of fn rolls it back and is
	// returned as it is. Owning the transaction from BEGIN, the store can
	// end it without a round trip of the driver's own.
	InTxCommit(ctx context.Context, fn func(tx TTx) error, p TakeAllParams) (TakeAllResult, error)

	// Read returns the rows of (Name, Key) as the transaction sees them,
	// locking nothing, and the clock.
	Read(ctx context.Context, tx TTx, p ReadParams) (ReadResult, error)

	// Credit gives p.Count tokens back to a limit (algo.CreditShards),
	// locking every row of it.
	Credit(ctx context.Context, tx TTx, p CreditParams) error

	// Reset deletes every row of k (a pause too).
	Reset(ctx context.Context, tx TTx, k KeyRef) error

	// Pause sets (or lifts) the pause of p's key: it locks every row of the
	// key in shard order and writes them as a take of nothing would (in
	// p.Limit's layout, created full for a key without rows), each with the
	// pause (engine.Pause).
	Pause(ctx context.Context, tx TTx, p PauseParams) error

	// Prune runs one batch of Prune in a short transaction of its own: it
	// examines up to p.Max keys after p.After, in the store's key order,
	// and deletes the rows of those that are full (PruneParams.Full),
	// passing over rows other transactions hold where the database can.
	Prune(ctx context.Context, p PruneParams) (PruneResult, error)

	// Ping checks that the database answers and has the txlimit table with
	// every column the library uses (else ErrNotMigrated).
	Ping(ctx context.Context) error

	// The operations of concurrency limits, on the txlimit_holder table
	// (holders.go).

	// Acquire grants every slot of p.Slots and takes every limit of
	// p.Takes, or does neither. It creates (when missing) and locks the lock
	// row of each slot's key, in the canonical order (SlotOrder), before
	// any row of the takes; counts the key's live holders with a read that
	// sees every committed holder (or fails, under REPEATABLE READ and
	// SERIALIZABLE, with a serialization error rather than count a stale
	// snapshot); decides (DecideSlot); takes p.Takes as TakeAll does when
	// every slot grants; and writes the grants when everything did. A call
	// that grants nothing leaves no row behind.
	Acquire(ctx context.Context, tx TTx, p AcquireParams) (AcquireResult, error)

	// Release deletes the holder p.Holder of p's key, live or expired;
	// OK when it was live. It locks nothing but that row.
	Release(ctx context.Context, tx TTx, p HolderParams) (HolderResult, error)

	// Extend pushes the expiry of p.Holder to the clock + p.HoldFor when
	// it is live (OK), under the key's lock row, which it raises too; it
	// does nothing to a holder that is not.
	Extend(ctx context.Context, tx TTx, p HolderParams) (HolderResult, error)

	// Holders returns the holders of (Name, Key) as tx sees them, locking
	// nothing, and the clock.
	Holders(ctx context.Context, tx TTx, p ReadParams) (HoldersResult, error)

	// ResetHolders deletes every holder of k and its lock row.
	ResetHolders(ctx context.Context, tx TTx, k KeyRef) error

	// PruneHolders runs one batch in a short transaction of its own on the
	// store's pool: it deletes up to p.Max rows of txlimit_holder that have
	// expired, holders and lock rows alike, without waiting for rows other
	// transactions hold where the database allows it, and returns how many.
	PruneHolders(ctx context.Context, p PruneHoldersParams) (int, error)

	// PingHolders checks, on the store's pool, that the txlimit_holder
	// table is there with every column the library uses (ErrNotMigrated
	// otherwise).
	PingHolders(ctx context.Context) error

	// The operations of idempotent takes, on the txlimit_idempotency table
	// (idempotency.go).

	// Claim makes p.ID the call's own (Claimed.Fresh) when it is unused,
	// inserting or taking over its row, which it holds until tx ends; it
	// waits for a transaction that holds the row (a concurrent first call)
	// and otherwise returns the first call's request and result, reading
	// the latest committed row (or failing, under REPEATABLE READ and
	// SERIALIZABLE, with a serialization error rather than read a stale
	// one).
	Claim(ctx context.Context, tx TTx, p ClaimParams) (Claimed, error)

	// Record ends a fresh claim of tx: it writes p.Result, or deletes the
	// row when p.Result is "".
	Record(ctx context.Context, tx TTx, p RecordParams) error

	// PruneClaims runs one batch in a short transaction of its own on the
	// store's pool: it deletes up to p.Max rows of txlimit_idempotency that
	// have expired, oldest first, passing over rows other transactions
	// hold where the database can, and returns how many.
	PruneClaims(ctx context.Context, p PruneClaimsParams) (int, error)

	// PingClaims checks, on the store's pool, that the txlimit_idempotency
	// table is there with every column the library uses (ErrNotMigrated
	// otherwise).
	PingClaims(ctx context.Context) error
}

// TakeInBatch is the Limiter's side of pgstore.SendBatch, set by package
// txlimit (limiter is a *txlimit.Limiter, reqs a []txlimit.Request, the
// result a txlimit.MultiResult): it calls send with its store's Ops and
// the takes, which send takes as TakeAll does, ahead of the batch.
var TakeInBatch func(ctx context.Context, limiter any, reqs any, send func(ops any, p TakeAllParams) (TakeAllResult, error)) (any, error)

// ClockRanger is what a store whose database cannot hold every instant adds
// to Ops: the first and the last instant it holds, outside which txlimit
// refuses a reading of Options.Clock.
type ClockRanger interface {
	ClockRange() (first, last time.Time)
}

// Microseconds are the instants an int64 of microseconds since the Unix
// epoch holds: algo's instants, and SQLite's stored ts.
var Microseconds = [2]time.Time{time.UnixMicro(math.MinInt64), time.UnixMicro(math.MaxInt64)}

// Limit is one limit of one key, as a store sees it.
type Limit struct {
	Name string
	Key  string
	// Config is the whole limit's: Rate, Capacity and MaxReserved in
	// total, not per shard.
	Config algo.Config
	Shards int
	// Origin is the instant (µs) windows of Period are aligned to; unused
	// for a token bucket and a calendar window.
	Origin int64
}

// LimitConfig is the configuration of a named limit, whatever the key.
type LimitConfig struct {
	Config algo.Config // as Limit's
	Shards int
	// Start, when Aligned, is the Origin of every key. Otherwise each
	// (name, key) gets a stable Origin in [0, Period) from a hash of the
	// two (txlimit.Config.Start).
	Start   int64
	Aligned bool
}

// Limit is c's limit for (name, key).
func (c LimitConfig) Limit(name, key string) Limit {
	l := Limit{Name: name, Key: key, Config: c.Config, Shards: c.Shards}
	if (c.Config.Kind == algo.FixedWindow || c.Config.Kind == algo.SlidingWindow) && c.Config.Calendar.Unit == 0 {
		l.Origin = c.Start
		if !c.Aligned {
			h := fnv.New64a()
			h.Write([]byte(name))
			h.Write([]byte{0})
			h.Write([]byte(key))
			l.Origin = int64(h.Sum64() % uint64(c.Config.Period))
		}
	}
	return l
}

// Shard returns the configuration of one of m shards of l.
func (l Limit) Shard(m int) algo.Config {
	c := l.Config
	n := float64(m)
	c.Rate /= n
	c.Capacity /= n
	c.MaxReserved /= n
	return c
}

// Full is the state of one of l's shards with no row: full.
func (l Limit) Full() algo.State { return algo.Full(l.Shard(l.Shards), l.Origin) }

// Row is one stored row of a limit.
type Row struct {
	Shard int32
	Value float64
	Prev  float64 // algo.State.Prev
	TS    time.Time
	// Paused is the instant until which the key is paused (the column
	// paused_until), zero for none. Every row of a paused key holds it
	// (PauseParams).
	Paused time.Time
}

// State is the row's state.
func (r Row) State() algo.State {
	return algo.State{Value: r.Value, Prev: r.Prev, TS: r.TS.UnixMicro()}
}

// TakeParams is one Take.
type TakeParams struct {
	Limit
	Count   float64
	Reserve bool
	// ReadAll asks for every shard's state in TakeResult.States even when
	// the store serves the call from one shard (txlimit's ReportRemaining).
	ReadAll bool
	// Now, when not nil, replaces the store's clock.
	Now *time.Time
	// TimeLocks asks the store to measure TakeResult.LockWait.
	TimeLocks bool
	// UpTo takes as many tokens as there are, up to Count (algo.TakeUpTo).
	UpTo bool
}

// TakeResult is what Take decided.
type TakeResult struct {
	Decision algo.Decision
	At       time.Time
	// States are the Limit.Shards states after the call (as they were,
	// for a denial), or nil when Partial: the store read only the shard
	// it took from.
	States   []algo.State
	Partial  bool
	LockWait time.Duration // in the statements that lock rows, with TimeLocks
	// Taken is how many tokens the call took (for Check, would take).
	Taken float64
	// Paused reports a denial because the key is paused (Paused): the
	// Decision's RetryAfter is the time until the pause ends.
	Paused bool
}

// TakeAllParams is one TakeAll. The (Name, Key) pairs of Takes are
// distinct; their Now and TimeLocks are ignored for the call's own.
type TakeAllParams struct {
	Takes     []TakeParams
	Now       *time.Time
	TimeLocks bool
}

// TakeAllResult is what TakeAll decided: OK when every limit granted and
// everything was taken, otherwise nothing was taken.
type TakeAllResult struct {
	OK bool
	// Results are in the order of Takes; each Decision is that limit's own
	// (OK, perhaps, in a denied call).
	Results  []TakeResult
	At       time.Time
	LockWait time.Duration
}

// ReadParams names the rows to read.
type ReadParams struct {
	Name string
	Key  string
	Now  *time.Time
}

// ReadResult is what Read found.
type ReadResult struct {
	Rows []Row
	At   time.Time
}

// CreditParams is one Credit.
type CreditParams struct {
	Limit
	Count float64
	Now   *time.Time
}

// KeyRef names a (name, key).
type KeyRef struct {
	Name string
	Key  string
}

// PruneParams is one batch of Prune.
type PruneParams struct {
	// After is the cursor: the batch starts after it, in the store's key
	// order, in which KeyRef{} comes first.
	After KeyRef
	Max   int
	Now   *time.Time
	// Limits are the configs of the names Prune judges; the keys of other
	// names are left alone.
	Limits map[string]LimitConfig
}

// PruneResult is what one Prune batch did.
type PruneResult struct {
	Keys    int // keys examined
	Unknown int // keys whose name Limits lacks
	Deleted int // rows deleted
	Last    KeyRef
}
