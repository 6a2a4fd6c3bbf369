package txlimit

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txlimit/txlimit/algo"
)

// Kind is the refill rule of a limit.
type Kind uint8

const (
	// TokenBucket adds Rate tokens per Period continuously, up to Capacity.
	TokenBucket Kind = Kind(algo.TokenBucket)
	// FixedWindow adds Rate tokens at the start of each window of Period,
	// up to Capacity.
	FixedWindow Kind = Kind(algo.FixedWindow)
)

func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "token bucket"
	case FixedWindow:
		return "fixed window"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MaxShards is the largest Shards a Config may have.
const MaxShards = 1024

// Config defines one limit.
type Config struct {
	// Kind is TokenBucket or FixedWindow. Required.
	Kind Kind
	// Rate is the number of tokens added per Period. Required, > 0.
	Rate float64
	// Period is the time over which Rate tokens are added. Required, at
	// least one microsecond (state is kept at microsecond precision).
	Period time.Duration
	// Capacity is the most tokens the limit holds: the largest burst.
	// Defaults to Rate.
	Capacity float64
	// MaxReserved caps how deep a reservation (the Reserve option) may put
	// the limit into debt. Defaults to 0, which means no cap.
	MaxReserved float64
	// Shards spreads the limit over this many rows so that concurrent
	// transactions do not queue on one row lock. Each shard holds
	// Rate/Shards, Capacity/Shards and MaxReserved/Shards. Defaults to 1;
	// at most MaxShards. A row is held until its transaction commits, so
	// give a hot limit about as many shards as transactions hold it at
	// once, and keep Capacity/Shards several times the count of one call
	// (docs/sharding.md).
	Shards int
	// Start aligns the windows of a FixedWindow limit: windows begin at
	// Start plus whole multiples of Period. When zero, each (name, key) gets
	// a stable offset in [0, Period) derived from a hash of the two, which
	// spreads the resets of many keys over the period. Must be zero for a
	// TokenBucket.
	Start time.Time
}

// normalized fills defaults and validates c. name is only used in errors.
func (c Config) normalized(name string) (Config, error) {
	bad := func(field, problem string, args ...any) (Config, error) {
		return Config{}, &InvalidError{Limit: name, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	if c.Kind != TokenBucket && c.Kind != FixedWindow {
		return bad("Kind", "must be txlimit.TokenBucket or txlimit.FixedWindow, got %v", c.Kind)
	}
	if !finite(c.Rate) || c.Rate <= 0 {
		return bad("Rate", "must be a finite number > 0, got %v", c.Rate)
	}
	if c.Period < time.Microsecond {
		return bad("Period", "must be at least 1µs, got %v", c.Period)
	}
	if c.Capacity == 0 {
		c.Capacity = c.Rate
	}
	if !finite(c.Capacity) || c.Capacity < 0 {
		return bad("Capacity", "must be a finite number > 0 (or 0 for the default, Rate), got %v", c.Capacity)
	}
	if !finite(c.MaxReserved) || c.MaxReserved < 0 {
		return bad("MaxReserved", "must be a finite number >= 0 (0 means no cap), got %v", c.MaxReserved)
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shards < 1 || c.Shards > MaxShards {
		return bad("Shards", "must be between 1 and %d (0 means 1), got %d", MaxShards, c.Shards)
	}
	if c.Kind == TokenBucket && !c.Start.IsZero() {
		return bad("Start", "applies to FixedWindow only; leave it zero for a TokenBucket")
	}
	c.Period = c.Period.Truncate(time.Microsecond)
	return c, nil
}

// shard returns the configuration of one of c's shards.
func (c Config) shard() algo.Config {
	n := float64(c.Shards)
	return algo.Config{
		Kind:        algo.Kind(c.Kind),
		Rate:        c.Rate / n,
		Period:      c.Period.Microseconds(),
		Capacity:    c.Capacity / n,
		MaxReserved: c.MaxReserved / n,
	}
}

// origin returns the instant (µs since the epoch) that the windows of a
// fixed-window limit are aligned to.
func (c Config) origin(name, key string) int64 {
	if !c.Start.IsZero() {
		return c.Start.UnixMicro()
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64() % uint64(c.Period.Microseconds()))
}

// Options configures a Limiter. The zero value is ready to use.
type Options struct {
	// Clock, when set, is read once per call and replaces the store's
	// clock: the database server's for PostgreSQL, the process's for SQLite
	// (which has no server). Meant for tests; in production the database
	// clock keeps application servers with skewed clocks in agreement.
	Clock func() time.Time

	// FailOpen chooses availability over enforcement for the forms that
	// open their own transaction (Limit, LimitAll, Check): when the store
	// fails (the database is down, the pool exhausted past the context's
	// deadline, a lock timeout), they return an OK Result with FailedOpen
	// set and a nil error, consuming nothing, and the error goes to the
	// Observer. Bad input, ErrNoPool and a cancelled context are still
	// returned as errors. The …Tx forms never fail open: the caller's
	// transaction has failed with the store, and only the caller can
	// decide what to do with it. Defaults to false: every error is
	// returned (fail closed).
	FailOpen bool

	// Observer, when set, is told about every decision and every error,
	// with the time spent waiting for row locks. See Observer.
	Observer Observer
}

// Limiter checks and consumes named limits whose state lives in a database.
// TTx is the store's transaction type (pgx.Tx for pgstore, *sql.Tx for
// sqlitestore) and is inferred from the store given to New.
//
// Every operation on a limit has two forms, following River: XTx runs in a
// transaction the caller owns, so the tokens are spent if and only if that
// transaction commits; X runs in a short transaction of its own on the
// store's pool. LimitAll takes several limits at once, all or none. Prune,
// the maintenance job that deletes the state of limits that are full again,
// runs transactions of its own.
//
// A Limiter is safe for concurrent use.
type Limiter[TTx any] struct {
	store           Store[TTx]
	limits          map[string]Config
	clock           func() time.Time
	observer        Observer
	failOpenOnError bool
	prune           pruneCursor
}

// New returns a Limiter on store with the named limits. Every config is
// validated; the first invalid one is returned as an *InvalidError. opts may
// be nil.
func New[TTx any](store Store[TTx], limits map[string]Config, opts *Options) (*Limiter[TTx], error) {
	if store == nil {
		return nil, &InvalidError{Field: "store", Problem: "is nil; pass pgstore.New(pool) or sqlitestore.New(db)"}
	}
	l := &Limiter[TTx]{store: store, limits: make(map[string]Config, len(limits))}
	for name, c := range limits {
		if err := validName(name); err != nil {
			return nil, err
		}
		nc, err := c.normalized(name)
		if err != nil {
			return nil, err
		}
		l.limits[name] = nc
	}
	if opts != nil {
		l.clock = opts.Clock
		l.observer = opts.Observer
		l.failOpenOnError = opts.FailOpen
	}
	return l, nil
}

// Config returns the normalized configuration of the named limit (defaults
// filled in) and whether the Limiter has it.
func (l *Limiter[TTx]) Config(name string) (Config, bool) {
	c, ok := l.limits[name]
	return c, ok
}

// Option modifies one call.
type Option func(*callOptions)

type callOptions struct {
	count     float64
	reserve   bool
	config    *Config
	remaining bool
}

// Count sets the number of tokens a call consumes, checks or credits.
// Defaults to 1. It may be fractional; it must be finite and >= 0.
func Count(n float64) Option { return func(o *callOptions) { o.count = n } }

// Reserve lets Limit take the tokens even when the limit lacks them, as a
// reservation: the result is OK with RetryAfter > 0, meaning the tokens are
// yours and the work should run after RetryAfter without checking the limit
// again. Config.MaxReserved caps the debt.
func Reserve() Option { return func(o *callOptions) { o.reserve = true } }

// WithRemaining makes a call on a sharded limit report Result.Remaining and
// NextToken even when PostgreSQL serves it from one free shard: that call
// then reads every shard, in the statement that takes its shard (no extra
// round trip, but more work on the hottest path: 10 to 40% more time per
// call in noisy local measurements). Calls that lock or read every shard
// anyway (unsharded limits, SQLite, LimitAll, Check) always report them.
func WithRemaining() Option { return func(o *callOptions) { o.remaining = true } }

// WithConfig gives the limit's configuration inline. It is required for a
// name that was not given to New and replaces the configuration of one that
// was.
func WithConfig(c Config) Option { return func(o *callOptions) { cc := c; o.config = &cc } }

// Result is the outcome of Limit or Check, or of one limit of LimitAll.
type Result struct {
	Name string
	Key  string
	// Count is the number of tokens the call asked for: what a cancelled
	// reservation gives back with Credit.
	Count float64
	// OK reports whether the tokens were granted (or, for Check, would be).
	OK bool
	// FailedOpen reports that the store failed and Options.FailOpen
	// granted the call without consuming anything (the error went to the
	// Observer).
	FailedOpen bool
	// RetryAfter is, when OK is false, the time until the same request
	// would be granted. When OK is true and RetryAfter > 0, the tokens were
	// reserved: run the work after RetryAfter, without checking again.
	RetryAfter time.Duration
	// At is the clock reading the decision was made at.
	At time.Time
	// Remaining is the number of tokens the limit holds after the call,
	// summed over all shards and projected to At: what later calls may
	// take. After a denial (or a Check), nothing was taken and it is what
	// the limit holds; it is negative while reservations are outstanding.
	// It is read under the call's locks, except where the call locked
	// nothing or not every shard (a denial decided on committed state, a
	// sharded limit served from one free shard on PostgreSQL with
	// WithRemaining): there the other shards count as last committed, and
	// transactions that hold them may be changing them. It is 0 when
	// Partial is set.
	Remaining float64
	// NextToken is the time from At until the limit holds one whole token
	// more than floor(Remaining) (at least one), if no call takes or gives
	// back tokens meanwhile: for that long a caller told it has
	// floor(Remaining) whole tokens cannot get more. It is what the HTTP
	// RateLimit header calls the effective window (package httplimit sends
	// it as t). It is 0 when the limit will never hold that many (its
	// Capacity is lower), and when Partial is set.
	NextToken time.Duration
	// Partial reports that the call read only one shard of a sharded
	// limit, so that Remaining and NextToken are unknown (and 0): a call
	// PostgreSQL served from one free shard, without WithRemaining.
	Partial bool
}

// Reserved reports whether the tokens were granted as a reservation for
// later.
func (r Result) Reserved() bool { return r.OK && r.RetryAfter > 0 }

// ReadyAt returns At plus RetryAfter: for a reservation, when the reserved
// work may run (a job's scheduled time); for a denial, when the same request
// would be granted; for an ordinary grant, At. It is on the clock the
// decision used (the database's, unless Options.Clock).
func (r Result) ReadyAt() time.Time { return r.At.Add(r.RetryAfter) }

// Err returns nil when the result is OK (a reservation included) and a
// *RateLimitedError otherwise, for code that prefers the error style.
func (r Result) Err() error {
	if r.OK {
		return nil
	}
	return &RateLimitedError{Name: r.Name, Key: r.Key, RetryAfter: r.RetryAfter}
}

// Snapshot is the state of a limit for display, returned by Value.
type Snapshot struct {
	// Value is the number of tokens available now, summed over all shards,
	// in the limit's own units (not per shard). Negative while reservations
	// are outstanding.
	Value float64
	// At is the clock reading Value was projected to.
	At time.Time
	// Config is the limit's normalized configuration.
	Config Config
}

var (
	// ErrRateLimited matches (errors.Is) every *RateLimitedError.
	ErrRateLimited = errors.New("txlimit: rate limited")
	// ErrInvalid matches (errors.Is) every *InvalidError.
	ErrInvalid = errors.New("txlimit: invalid argument")
	// ErrUnknownLimit matches the *InvalidError for a name that New was not
	// given, in a call without WithConfig.
	ErrUnknownLimit = errors.New("txlimit: unknown limit")
	// ErrNoPool is returned by the forms without Tx when the store has no
	// pool or database.
	ErrNoPool = errors.New("txlimit: the store has no pool or database; use the ...Tx forms or pass one to the store's New")
)

// RateLimitedError is the error form of a denied Result.
type RateLimitedError struct {
	Name       string
	Key        string
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("txlimit: limit %q key %q: rate limited, retry after %v", e.Name, e.Key, e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// InvalidError reports bad input: a config, a name, a key or a count. When it
// is returned nothing was written.
type InvalidError struct {
	Limit   string // the limit's name, when known
	Field   string // the offending field or argument
	Problem string // what is wrong and how to fix it
	unknown bool
}

func (e *InvalidError) Error() string {
	var b strings.Builder
	b.WriteString("txlimit: ")
	if e.Limit != "" {
		fmt.Fprintf(&b, "limit %q: ", e.Limit)
	}
	b.WriteString(e.Field)
	b.WriteString(" ")
	b.WriteString(e.Problem)
	return b.String()
}

// Is makes errors.Is(err, ErrInvalid) true, and errors.Is(err,
// ErrUnknownLimit) for an unknown name.
func (e *InvalidError) Is(target error) bool {
	return target == ErrInvalid || (e.unknown && target == ErrUnknownLimit)
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func validName(name string) error {
	if name == "" {
		return &InvalidError{Field: "name", Problem: "is empty; every limit needs a name"}
	}
	return validText("name", name, name)
}

func validText(field, limit, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return &InvalidError{Limit: limit, Field: field, Problem: "contains a NUL byte, which PostgreSQL text cannot hold; encode it (hex, base64) first"}
	}
	if !utf8.ValidString(s) {
		return &InvalidError{Limit: limit, Field: field, Problem: "is not valid UTF-8; encode it (hex, base64) first"}
	}
	return nil
}

// request is one validated call.
type request struct {
	name      string
	key       string
	count     float64
	reserve   bool
	remaining bool
	config    Config
	shard     algo.Config
	origin    int64
	obs       *observation // nil unless the Limiter has an Observer
}

func (l *Limiter[TTx]) newRequest(name, key string, opts []Option) (request, error) {
	o := callOptions{count: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if err := validName(name); err != nil {
		return request{}, err
	}
	if err := validText("key", name, key); err != nil {
		return request{}, err
	}
	var cfg Config
	if o.config != nil {
		c, err := o.config.normalized(name)
		if err != nil {
			return request{}, err
		}
		cfg = c
	} else {
		c, ok := l.limits[name]
		if !ok {
			return request{}, &InvalidError{Limit: name, Field: "name", unknown: true,
				Problem: "is not a limit given to txlimit.New; add it there or pass txlimit.WithConfig"}
		}
		cfg = c
	}
	if !finite(o.count) || o.count < 0 {
		return request{}, &InvalidError{Limit: name, Field: "Count", Problem: fmt.Sprintf("must be a finite number >= 0, got %v", o.count)}
	}
	r := request{name: name, key: key, count: o.count, reserve: o.reserve, remaining: o.remaining, config: cfg, shard: cfg.shard()}
	if cfg.Kind == FixedWindow {
		r.origin = cfg.origin(name, key)
	}
	return r, nil
}

// countOf returns the count opts ask for, for the Observer and a failed-open
// Result, which have no validated request to take it from.
func countOf(opts []Option) float64 {
	o := callOptions{count: 1}
	for _, opt := range opts {
		opt(&o)
	}
	return o.count
}

// checkCount rejects a count that no amount of waiting would grant.
func (r request) checkCount() error {
	c := r.config
	switch {
	case !r.reserve && r.count > c.Capacity:
		return &InvalidError{Limit: r.name, Field: "Count", Problem: fmt.Sprintf(
			"%v exceeds Capacity %v and could never be granted; raise Capacity or use Reserve", r.count, c.Capacity)}
	case r.reserve && c.MaxReserved > 0 && r.count > c.Capacity+c.MaxReserved:
		return &InvalidError{Limit: r.name, Field: "Count", Problem: fmt.Sprintf(
			"%v exceeds Capacity+MaxReserved %v and could never be reserved; raise MaxReserved", r.count, c.Capacity+c.MaxReserved)}
	}
	return nil
}

func (l *Limiter[TTx]) now() *time.Time {
	if l.clock == nil {
		return nil
	}
	t := time.UnixMicro(l.clock().UnixMicro())
	return &t
}

// Limit is LimitTx in a short transaction of its own. With
// Options.FailOpen, a failure of the store grants the call (see Options).
func (l *Limiter[TTx]) Limit(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	r, err := l.limitRequest(name, key, opts, obs)
	var res Result
	if err == nil {
		err = l.store.InTx(ctx, false, func(tx TTx) (err error) {
			res, err = l.limit(ctx, tx, r)
			return err
		})
	}
	return l.finish(ctx, obs, OpLimit, name, key, opts, res, err, true)
}

// LimitTx checks the limit name for key and, when the tokens are there (or
// the Reserve option allows a reservation), consumes them in tx. The tokens
// are spent if and only if tx commits; a rollback gives them back. A denied
// call writes nothing. The rows of the limit stay locked until tx ends, so
// keep the transaction short, or use Shards for a limit many transactions
// share.
//
// A denial is a Result with OK false, not an error; call Result.Err for the
// error style. Errors are bad input (*InvalidError, nothing written) or the
// database's own; a serialization failure under REPEATABLE READ or
// SERIALIZABLE is retryable like any other.
func (l *Limiter[TTx]) LimitTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	r, err := l.limitRequest(name, key, opts, obs)
	var res Result
	if err == nil {
		res, err = l.limit(ctx, tx, r)
	}
	return l.finish(ctx, obs, OpLimit, name, key, opts, res, err, false)
}

// limitRequest validates a Limit call.
func (l *Limiter[TTx]) limitRequest(name, key string, opts []Option, obs *observation) (request, error) {
	r, err := l.newRequest(name, key, opts)
	if err == nil {
		err = r.checkCount()
	}
	r.obs = obs
	return r, err
}

// finish ends a Limit or Check call: it applies Options.FailOpen to the
// error of a form without Tx (mayFailOpen) and tells the Observer.
func (l *Limiter[TTx]) finish(ctx context.Context, obs *observation, op Op, name, key string, opts []Option, res Result, err error, mayFailOpen bool) (Result, error) {
	failedOpen := mayFailOpen && l.failOpen(err)
	switch {
	case failedOpen:
		res = Result{Name: name, Key: key, Count: countOf(opts), OK: true, FailedOpen: true, At: time.Now()}
	case err != nil:
		res = Result{}
	}
	if obs != nil {
		l.report(ctx, obs, op, request{name: name, key: key, count: countOf(opts)}, res, err, failedOpen)
	}
	if failedOpen {
		return res, nil
	}
	return res, err
}

func (l *Limiter[TTx]) limit(ctx context.Context, tx TTx, r request) (Result, error) {
	now := l.now()
	n := r.config.Shards
	if n > 1 && l.store.SkipsLocked() && r.count <= r.shard.Capacity {
		res, done, err := l.limitOneShard(ctx, tx, r, now)
		if err != nil || done {
			return res, err
		}
	}
	if n > 1 && !r.reserve && l.store.SkipsLocked() {
		// Before queueing on every shard, see whether the committed state
		// already rules the request out. Concurrent transactions can only
		// lower it further (a concurrent Credit or Reset is ordered after
		// this call), so such a denial is right without any lock. (A store
		// with one writer at a time has no queue per row to avoid, and a
		// read before the write lock would only hold a stale snapshot.)
		rows, at, err := l.store.ReadShards(ctx, tx, KeyParams{Name: r.name, Key: r.key, Now: now})
		if err != nil {
			return Result{}, err
		}
		states := r.states(rows)
		if _, d := algo.TakeShards(r.shard, states, at.UnixMicro(), r.count, false); !d.OK {
			return r.result(d, at, states), nil
		}
	}
	rows, at, err := l.lockAll(ctx, tx, r, now)
	if err != nil {
		return Result{}, err
	}
	states := r.states(rows)
	next, d := algo.TakeShards(r.shard, states, at.UnixMicro(), r.count, r.reserve)
	if d.OK {
		if err := l.store.WriteShards(ctx, tx, r.writes(next)); err != nil {
			return Result{}, err
		}
	}
	return r.result(d, at, next), nil
}

// limitOneShard is the fast path of a sharded limit: take the first shard,
// going up from a random one, that no other transaction holds, and consume
// from it alone when it has enough. done is false when the caller must fall
// back to locking every shard; the shard's lock has then been released. With
// WithRemaining the other shards are read, as last committed, in the same
// statement, for the result's Remaining; without it the result is Partial.
func (l *Limiter[TTx]) limitOneShard(ctx context.Context, tx TTx, r request, now *time.Time) (Result, bool, error) {
	start := int32(rand.IntN(r.config.Shards))
	lockStart := r.obs.lockStart()
	tried, err := l.store.TryLockShard(ctx, tx, TryLockParams{Name: r.name, Key: r.key, Start: start, Now: now, ReadAll: r.remaining})
	if err == nil && !tried.Locked && (!r.remaining || len(tried.All) >= r.config.Shards) {
		// Every shard is held (or, without ReadAll, possibly missing).
		// Queue for one, the random first choice, rather than for all
		// of them: holding nothing of this key while waiting for a single
		// row cannot deadlock, and locking every shard here would make each
		// call that starts meanwhile find them all busy too. A missing row
		// comes back unlocked at once, and lockAll creates it.
		var all []ShardRow
		all, tried.All = tried.All, nil
		tried, err = l.store.WaitShard(ctx, tx, WaitShardParams{Name: r.name, Key: r.key, Shard: start, Now: now})
		if r.remaining {
			tried.All = all
		}
	}
	r.obs.lockEnd(lockStart)
	if err != nil {
		return Result{}, false, err
	}
	if tried.Locked && int(tried.Row.Shard) < r.config.Shards {
		at := tried.Now
		st := algo.State{Value: tried.Row.Value, TS: tried.Row.TS.UnixMicro()}
		next, d := algo.Take(r.shard, st, at.UnixMicro(), r.count, false)
		if d.OK {
			err := l.store.KeepTry(ctx, tx, []ShardWrite{{
				Name: r.name, Key: r.key, Shard: tried.Row.Shard, Value: next.Value, TS: time.UnixMicro(next.TS),
			}})
			if err != nil {
				return Result{}, false, err
			}
			if !r.remaining {
				return Result{
					Name: r.name, Key: r.key, Count: r.count, OK: true, At: at, Partial: true,
					RetryAfter: time.Duration(d.RetryAfter) * time.Microsecond,
				}, true, nil
			}
			states := r.states(tried.All)
			states[tried.Row.Shard] = next
			return r.result(d, at, states), true, nil
		}
	}
	return Result{}, false, l.store.UndoTry(ctx, tx)
}

// lockAll locks every shard of r's limit in shard order, creating the
// missing ones as full: it locks the rows there are, and when some are
// missing, creates them, locking the others as it goes in shard order
// (InsertShards), and reads them all again.
func (l *Limiter[TTx]) lockAll(ctx context.Context, tx TTx, r request, now *time.Time) ([]ShardRow, time.Time, error) {
	lockStart := r.obs.lockStart()
	defer r.obs.lockEnd(lockStart)
	p := KeyParams{Name: r.name, Key: r.key, Now: now}
	rows, at, err := l.store.LockShards(ctx, tx, p)
	if err != nil || len(rows) >= r.config.Shards {
		return rows, at, err
	}
	full := algo.Full(r.shard, r.origin)
	err = l.store.InsertShards(ctx, tx, InsertParams{
		Name: r.name, Key: r.key, Shards: int32(r.config.Shards), Value: full.Value, TS: time.UnixMicro(full.TS),
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return l.store.LockShards(ctx, tx, p)
}

// states returns the state of every shard of r's limit: the stored row, or a
// full state for a row that does not exist. Rows beyond the configured number
// of shards (left by an earlier config with more) are ignored.
func (r request) states(rows []ShardRow) []algo.State {
	full := algo.Full(r.shard, r.origin)
	states := make([]algo.State, r.config.Shards)
	for i := range states {
		states[i] = full
	}
	for _, row := range rows {
		if int(row.Shard) < len(states) {
			states[row.Shard] = algo.State{Value: row.Value, TS: row.TS.UnixMicro()}
		}
	}
	return states
}

func (r request) writes(states []algo.State) []ShardWrite {
	w := make([]ShardWrite, len(states))
	for i, s := range states {
		w[i] = ShardWrite{Name: r.name, Key: r.key, Shard: int32(i), Value: s.Value, TS: time.UnixMicro(s.TS)}
	}
	return w
}

// result is the Result of decision d made at at, where states are the
// shards after the call (unchanged when nothing was taken).
func (r request) result(d algo.Decision, at time.Time, states []algo.State) Result {
	now := at.UnixMicro()
	remaining := algo.Pooled(r.shard, states, now)
	return Result{
		Name: r.name, Key: r.key, Count: r.count, OK: d.OK,
		RetryAfter: time.Duration(d.RetryAfter) * time.Microsecond,
		At:         at,
		Remaining:  remaining,
		NextToken:  r.nextToken(states, now, remaining),
	}
}

// nextToken returns the time until the shards, left alone, pool one whole
// token more than floor(remaining) (at least one), or 0 when that exceeds
// the limit's capacity.
func (r request) nextToken(states []algo.State, now int64, remaining float64) time.Duration {
	target := math.Floor(max(remaining, 0)) + 1
	if target > r.config.Capacity {
		return 0
	}
	// The time until a request of target tokens would fit is exactly the
	// time until the limit holds target tokens.
	_, d := algo.TakeShards(r.shard, states, now, target, false)
	return time.Duration(d.RetryAfter) * time.Microsecond
}

// Check is CheckTx in a short transaction of its own. With
// Options.FailOpen, a failure of the store answers OK (see Options).
func (l *Limiter[TTx]) Check(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	var res Result
	err := l.store.InTx(ctx, true, func(tx TTx) (err error) {
		res, err = l.check(ctx, tx, name, key, opts)
		return err
	})
	return l.finish(ctx, obs, OpCheck, name, key, opts, res, err, true)
}

// CheckTx returns the decision LimitTx would make now, consuming nothing,
// writing nothing and locking nothing. Under concurrency the answer may be
// stale by the time it is used; only LimitTx consumes atomically.
func (l *Limiter[TTx]) CheckTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	res, err := l.check(ctx, tx, name, key, opts)
	return l.finish(ctx, obs, OpCheck, name, key, opts, res, err, false)
}

func (l *Limiter[TTx]) check(ctx context.Context, tx TTx, name, key string, opts []Option) (Result, error) {
	r, err := l.newRequest(name, key, opts)
	if err == nil {
		err = r.checkCount()
	}
	if err != nil {
		return Result{}, err
	}
	rows, at, err := l.store.ReadShards(ctx, tx, KeyParams{Name: r.name, Key: r.key, Now: l.now()})
	if err != nil {
		return Result{}, err
	}
	states := r.states(rows)
	_, d := algo.TakeShards(r.shard, states, at.UnixMicro(), r.count, r.reserve)
	return r.result(d, at, states), nil
}

// Reset is ResetTx in a short transaction of its own.
func (l *Limiter[TTx]) Reset(ctx context.Context, name, key string) error {
	return l.store.InTx(ctx, false, func(tx TTx) error { return l.ResetTx(ctx, tx, name, key) })
}

// ResetTx deletes the state of (name, key), all shards, so that the limit is
// full again. It needs no config, so it also clears limits no longer defined.
func (l *Limiter[TTx]) ResetTx(ctx context.Context, tx TTx, name, key string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := validText("key", name, key); err != nil {
		return err
	}
	return l.store.DeleteKey(ctx, tx, name, key)
}

// Value is ValueTx in a short transaction of its own.
func (l *Limiter[TTx]) Value(ctx context.Context, name, key string, opts ...Option) (Snapshot, error) {
	var s Snapshot
	err := l.store.InTx(ctx, true, func(tx TTx) (err error) {
		s, err = l.ValueTx(ctx, tx, name, key, opts...)
		return err
	})
	return s, err
}

// ValueTx returns the tokens of (name, key) projected to now and summed over
// all shards, with the time of the reading and the config: what a UI needs to
// draw the limit. It locks and writes nothing. Only WithConfig is used among
// opts.
func (l *Limiter[TTx]) ValueTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Snapshot, error) {
	r, err := l.newRequest(name, key, opts)
	if err != nil {
		return Snapshot{}, err
	}
	rows, at, err := l.store.ReadShards(ctx, tx, KeyParams{Name: r.name, Key: r.key, Now: l.now()})
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Value: algo.Pooled(r.shard, r.states(rows), at.UnixMicro()), At: at, Config: r.config}, nil
}

// Credit is CreditTx in a short transaction of its own.
func (l *Limiter[TTx]) Credit(ctx context.Context, name, key string, count float64, opts ...Option) error {
	return l.store.InTx(ctx, false, func(tx TTx) error { return l.CreditTx(ctx, tx, name, key, count, opts...) })
}

// CreditTx gives count tokens back to (name, key), for example those of a
// reservation whose work was cancelled (Result.Count is what it took), never
// lifting the limit above its Capacity. Only WithConfig is used among opts.
//
// A credit is not tied to any reservation: crediting twice gives the tokens
// twice. Make it happen once by crediting in the same transaction as the
// change that cancels the work, under a lock on that work's own row (for a
// River job: credit only when JobCancelTx reports the job cancelled, in the
// same transaction; examples/river does exactly that).
func (l *Limiter[TTx]) CreditTx(ctx context.Context, tx TTx, name, key string, count float64, opts ...Option) error {
	r, err := l.newRequest(name, key, append(opts[:len(opts):len(opts)], Count(count)))
	if err != nil {
		return err
	}
	rows, at, err := l.lockAll(ctx, tx, r, l.now())
	if err != nil {
		return err
	}
	next := algo.CreditShards(r.shard, r.states(rows), at.UnixMicro(), r.count)
	return l.store.WriteShards(ctx, tx, r.writes(next))
}
