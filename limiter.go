package txlimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
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

// MaxWait is the longest wait a Result reports: half the range of
// time.Duration, about 146 years (2^62 ns, in whole microseconds), so that
// adding a jitter or a period to it cannot overflow. A denial whose wait is
// longer (a Rate of 1e-300, a Period of a century with a large count) says
// RetryAfter = MaxWait; a reservation whose wait would reach it is refused
// with an *InvalidError for its Count, and nothing is taken.
const MaxWait = time.Duration(algo.MaxWait) * time.Microsecond

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
	// Escrow takes the tokens at once, outside the caller's transaction,
	// and only escrows them until it ends: kept if it commits, given back
	// by settlement if it does not. The limit's row is then locked only for
	// one statement, never until the caller commits, so one hot key no
	// longer queues its callers. The price: the tokens of a caller that
	// rolls back come back late (at the next call of the key that would be
	// denied without them, or at the next settlement: pgstore settles in
	// the background about once a second while escrow calls are made, and
	// Limiter.Settle settles on demand), never early. An escrow limit has
	// one shard (Shards must be 0 or 1). LimitAllTx takes escrow limits
	// first and cancels them when another limit denies. PostgreSQL
	// (pgstore, with a pool) only; run Limiter.Settle every few seconds for
	// the calls left when the calls stop. Limit and LimitAll (the forms
	// without Tx) take an escrow limit in their own short transaction, as
	// the locked model does. See docs/escrow.md.
	// Defaults to false: the row is locked until the caller's transaction
	// ends.
	Escrow bool
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
	if c.Escrow && c.Shards > 1 {
		return bad("Shards", "must be 1 (or 0) for an Escrow limit, got %d: escrow already keeps the row from being held, so shards add nothing", c.Shards)
	}
	if c.Kind == TokenBucket && !c.Start.IsZero() {
		return bad("Start", "applies to FixedWindow only; leave it zero for a TokenBucket")
	}
	c.Period = c.Period.Truncate(time.Microsecond)
	return c, nil
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
	// Observer. Bad input, ErrNoPool, ErrNotMigrated and a cancelled context are still
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
// pgsqlstore and sqlitestore) and is inferred from the store given to New.
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
	escrow          driver.Escrower // nil when the store has no escrow mode
}

// New returns a Limiter on store with the named limits. Every config is
// validated; the first invalid one is returned as an *InvalidError. opts may
// be nil.
func New[TTx any](store Store[TTx], limits map[string]Config, opts *Options) (*Limiter[TTx], error) {
	if store == nil {
		return nil, &InvalidError{Field: "store", Problem: "is nil; pass pgstore.New(pool), pgsqlstore.New(db) or sqlitestore.New(db)"}
	}
	l := &Limiter[TTx]{store: store, limits: make(map[string]Config, len(limits)), escrow: escrowStore(store)}
	for name, c := range limits {
		if err := validName(name); err != nil {
			return nil, err
		}
		nc, err := c.normalized(name)
		if err == nil {
			err = checkEscrow(l.escrow, name, nc)
		}
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
// again. Config.MaxReserved caps the debt. A reservation whose wait would
// reach MaxWait, or whose debt would leave float64's range, is refused with
// an *InvalidError for Count, taking nothing.
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
	// It is never negative and never more than MaxWait: a denial whose
	// wait is longer says MaxWait.
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
	// Capacity is lower), and when Partial is set; never more than MaxWait.
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
	ErrNoPool = driver.ErrNoPool
	// ErrNotMigrated matches the error of every call on a database whose
	// txlimit table is missing or out of date: run migrations.Up first.
	// Limiter.Ping reports it at startup. Options.FailOpen never grants on
	// it: it is a mistake in the deployment, not an outage.
	ErrNotMigrated = driver.ErrNotMigrated
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

// MaxNameLen and MaxKeyLen bound the length in bytes of a limit's name and
// key, so that (name, key, shard) fits one index entry on every store
// (PostgreSQL's B-tree takes at most 2704 bytes). A longer key is an
// *InvalidError on every store; hash it first (for example the hex of its
// SHA-256) when it can be longer.
const (
	MaxNameLen = 256
	MaxKeyLen  = 2048
)

func validText(field, limit, s string) error {
	bound := MaxKeyLen
	if field == "name" {
		bound = MaxNameLen
	}
	if len(s) > bound {
		return &InvalidError{Limit: limit, Field: field, Problem: fmt.Sprintf(
			"is %d bytes long, more than the %d a limit's %s may have; hash it first (for example the hex of its SHA-256)", len(s), bound, field)}
	}
	if strings.IndexByte(s, 0) >= 0 {
		return &InvalidError{Limit: limit, Field: field, Problem: "contains a NUL byte, which PostgreSQL text cannot hold; encode it (hex, base64) first"}
	}
	if !utf8.ValidString(s) {
		return &InvalidError{Limit: limit, Field: field, Problem: "is not valid UTF-8; encode it (hex, base64) first"}
	}
	return nil
}

// request is one call, validated by newRequest.
type request struct {
	name      string
	key       string
	count     float64
	reserve   bool
	remaining bool
	config    Config
	limit     driver.Limit
	ownTx     bool         // the call runs in a transaction of the Limiter's own (Limit)
	obs       *observation // nil unless the Limiter has an Observer
}

// newRequest validates a call. The request it returns on an error still
// names the call (name, key, count), for the Observer.
func (l *Limiter[TTx]) newRequest(name, key string, opts []Option) (request, error) {
	o := callOptions{count: 1}
	for _, opt := range opts {
		opt(&o)
	}
	r := request{name: name, key: key, count: o.count, reserve: o.reserve, remaining: o.remaining}
	if err := validName(name); err != nil {
		return r, err
	}
	if err := validText("key", name, key); err != nil {
		return r, err
	}
	if o.config != nil {
		c, err := o.config.normalized(name)
		if err == nil {
			err = checkEscrow(l.escrow, name, c)
		}
		if err != nil {
			return r, err
		}
		r.config = c
	} else {
		c, ok := l.limits[name]
		if !ok {
			return r, &InvalidError{Limit: name, Field: "name", unknown: true,
				Problem: "is not a limit given to txlimit.New; add it there or pass txlimit.WithConfig"}
		}
		r.config = c
	}
	if !finite(o.count) || o.count < 0 {
		return r, &InvalidError{Limit: name, Field: "Count", Problem: fmt.Sprintf("must be a finite number >= 0, got %v", o.count)}
	}
	r.limit = r.config.stored().Limit(name, key)
	return r, nil
}

// stored is c as a store sees it, for every key.
func (c Config) stored() driver.LimitConfig {
	return driver.LimitConfig{
		Config: algo.Config{
			Kind: algo.Kind(c.Kind), Rate: c.Rate, Period: c.Period.Microseconds(),
			Capacity: c.Capacity, MaxReserved: c.MaxReserved,
		},
		Shards: c.Shards, Start: c.Start.UnixMicro(), Aligned: !c.Start.IsZero(),
	}
}

// shard is the configuration of one of r's shards.
func (r request) shard() algo.Config { return r.limit.Shard(r.limit.Shards) }

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

// take is the store's Take for r.
func (r request) take(now *time.Time) driver.TakeParams {
	return driver.TakeParams{
		Limit: r.limit, Count: r.count, Reserve: r.reserve, ReadAll: r.remaining,
		Now: now, TimeLocks: r.obs != nil, Escrow: r.config.Escrow && !r.ownTx,
	}
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
		// An escrow limit is taken like any other here: the row is held
		// only for this short transaction anyway, and an escrow debit
		// would need a second connection of the same pool.
		r.ownTx = true
		err = l.store.InTx(ctx, false, func(tx TTx) (err error) {
			res, err = l.limit(ctx, tx, r)
			return err
		})
	}
	return l.finish(ctx, OpLimit, r, res, err, true)
}

// LimitTx checks the limit name for key and, when the tokens are there (or
// the Reserve option allows a reservation), consumes them in tx. The tokens
// are spent if and only if tx commits; a rollback gives them back. A denied
// call writes nothing. The rows of the limit stay locked until tx ends, so
// keep the transaction short, or use Shards or Escrow for a limit many
// transactions share. An Escrow limit is not locked past the call: see
// Config.Escrow.
//
// A denial is a Result with OK false, not an error; call Result.Err for the
// error style. Errors are bad input (*InvalidError, nothing written) or the
// database's own; a serialization failure under REPEATABLE READ or
// SERIALIZABLE is retryable like any other.
//
// Do not call Limit, Check or any other form without Tx for the same key
// while tx holds it: that call runs in a transaction of its own, which waits
// for tx's row lock, and tx waits for the call: it ends only with ctx.
func (l *Limiter[TTx]) LimitTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	r, err := l.limitRequest(name, key, opts, obs)
	var res Result
	if err == nil {
		res, err = l.limit(ctx, tx, r)
	}
	return l.finish(ctx, OpLimit, r, res, err, false)
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
func (l *Limiter[TTx]) finish(ctx context.Context, op Op, r request, res Result, err error, mayFailOpen bool) (Result, error) {
	failedOpen := mayFailOpen && l.failOpen(err)
	switch {
	case failedOpen:
		res = r.failedOpen(time.Now())
	case err != nil:
		res = Result{}
	}
	l.report(ctx, r.obs, op, r, res, err, failedOpen)
	if failedOpen {
		return res, nil
	}
	return res, err
}

// failedOpen is the Result of r granted by Options.FailOpen.
func (r request) failedOpen(at time.Time) Result {
	return Result{Name: r.name, Key: r.key, Count: r.count, OK: true, FailedOpen: true, At: at}
}

func (l *Limiter[TTx]) limit(ctx context.Context, tx TTx, r request) (Result, error) {
	t, err := l.store.Take(ctx, tx, r.take(l.now()))
	if err != nil {
		return Result{}, err
	}
	r.obs.addLockWait(t.LockWait)
	return r.result(t.Decision, t.At, t.States)
}

// result is the Result of decision d made at at, where states are the
// shards after the call (unchanged when nothing was taken), or nil when the
// store read one shard only (Partial).
func (r request) result(d algo.Decision, at time.Time, states []algo.State) (Result, error) {
	if d.Overflow {
		return Result{}, r.overflowError()
	}
	res := Result{
		Name: r.name, Key: r.key, Count: r.count, OK: d.OK,
		RetryAfter: time.Duration(d.RetryAfter) * time.Microsecond,
		At:         at,
		Partial:    states == nil,
	}
	if states != nil {
		now := at.UnixMicro()
		res.Remaining = algo.Pooled(r.shard(), states, now)
		res.NextToken = r.nextToken(states, now, res.Remaining)
	}
	return res, nil
}

// overflowError is the error of a reservation that algo refused because
// its wait would reach MaxWait or its debt leave float64's range.
func (r request) overflowError() error {
	c := r.config
	return &InvalidError{Limit: r.name, Field: "Count", Problem: fmt.Sprintf(
		"%v reserved at Rate %v per %v would put the limit in a debt it repays only after txlimit.MaxWait (about 146 years) or more, "+
			"or beyond what a float64 holds; nothing was taken. Lower Count, raise Rate, or set MaxReserved to cap the debt",
		r.count, c.Rate, c.Period)}
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
	_, d := algo.TakeShards(r.shard(), states, now, target, false)
	return time.Duration(d.RetryAfter) * time.Microsecond
}

// Check is CheckTx in a short transaction of its own. With
// Options.FailOpen, a failure of the store answers OK (see Options).
func (l *Limiter[TTx]) Check(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	r, err := l.limitRequest(name, key, opts, obs)
	var res Result
	if err == nil {
		err = l.store.InTx(ctx, true, func(tx TTx) (err error) {
			res, err = l.check(ctx, tx, r)
			return err
		})
	}
	return l.finish(ctx, OpCheck, r, res, err, true)
}

// CheckTx returns the decision LimitTx would make now, consuming nothing,
// writing nothing and locking nothing. Under concurrency the answer may be
// stale by the time it is used; only LimitTx consumes atomically.
func (l *Limiter[TTx]) CheckTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	obs := l.observe()
	r, err := l.limitRequest(name, key, opts, obs)
	var res Result
	if err == nil {
		res, err = l.check(ctx, tx, r)
	}
	return l.finish(ctx, OpCheck, r, res, err, false)
}

func (l *Limiter[TTx]) check(ctx context.Context, tx TTx, r request) (Result, error) {
	now := l.now()
	read, err := l.store.Read(ctx, tx, driver.ReadParams{Name: r.name, Key: r.key, Now: now})
	if err != nil {
		return Result{}, err
	}
	t := driver.Check(r.take(now), read)
	return r.result(t.Decision, t.At, t.States)
}

// Reset is ResetTx in a short transaction of its own.
func (l *Limiter[TTx]) Reset(ctx context.Context, name, key string) error {
	obs := l.observe()
	r, err := l.keyRequest(name, key, obs)
	if err == nil {
		err = l.store.InTx(ctx, false, func(tx TTx) error { return l.reset(ctx, tx, r) })
	}
	l.report(ctx, obs, OpReset, r, Result{}, err, false)
	return err
}

// ResetTx deletes the state of (name, key), all shards, so that the limit is
// full again. It needs no config, so it also clears limits no longer defined.
func (l *Limiter[TTx]) ResetTx(ctx context.Context, tx TTx, name, key string) error {
	obs := l.observe()
	r, err := l.keyRequest(name, key, obs)
	if err == nil {
		err = l.reset(ctx, tx, r)
	}
	l.report(ctx, obs, OpReset, r, Result{}, err, false)
	return err
}

// keyRequest validates a call that names a key and needs no config.
func (l *Limiter[TTx]) keyRequest(name, key string, obs *observation) (request, error) {
	r := request{name: name, key: key, obs: obs}
	if err := validName(name); err != nil {
		return r, err
	}
	return r, validText("key", name, key)
}

func (l *Limiter[TTx]) reset(ctx context.Context, tx TTx, r request) error {
	return l.store.Reset(ctx, tx, driver.ResetParams{Name: r.name, Key: r.key, Escrow: l.limits[r.name].Escrow})
}

// Value is ValueTx in a short transaction of its own.
func (l *Limiter[TTx]) Value(ctx context.Context, name, key string, opts ...Option) (Snapshot, error) {
	obs := l.observe()
	r, err := l.newRequest(name, key, opts)
	r.obs = obs
	var s Snapshot
	if err == nil {
		err = l.store.InTx(ctx, true, func(tx TTx) (err error) {
			s, err = l.value(ctx, tx, r)
			return err
		})
	}
	l.report(ctx, obs, OpValue, r, Result{}, err, false)
	return s, err
}

// ValueTx returns the tokens of (name, key) projected to now and summed over
// all shards, with the time of the reading and the config: what a UI needs to
// draw the limit. It locks and writes nothing. Only WithConfig is used among
// opts.
func (l *Limiter[TTx]) ValueTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Snapshot, error) {
	obs := l.observe()
	r, err := l.newRequest(name, key, opts)
	r.obs = obs
	var s Snapshot
	if err == nil {
		s, err = l.value(ctx, tx, r)
	}
	l.report(ctx, obs, OpValue, r, Result{}, err, false)
	return s, err
}

func (l *Limiter[TTx]) value(ctx context.Context, tx TTx, r request) (Snapshot, error) {
	read, err := l.store.Read(ctx, tx, driver.ReadParams{Name: r.name, Key: r.key, Now: l.now()})
	if err != nil {
		return Snapshot{}, err
	}
	now := read.At.UnixMicro()
	states, _ := r.limit.States(read.Rows, now)
	return Snapshot{Value: algo.Pooled(r.shard(), states, now), At: read.At, Config: r.config}, nil
}

// Credit is CreditTx in a short transaction of its own.
func (l *Limiter[TTx]) Credit(ctx context.Context, name, key string, count float64, opts ...Option) error {
	obs := l.observe()
	r, err := l.creditRequest(name, key, count, opts, obs)
	if err == nil {
		err = l.store.InTx(ctx, false, func(tx TTx) error { return l.credit(ctx, tx, r) })
	}
	l.report(ctx, obs, OpCredit, r, Result{}, err, false)
	return err
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
	obs := l.observe()
	r, err := l.creditRequest(name, key, count, opts, obs)
	if err == nil {
		err = l.credit(ctx, tx, r)
	}
	l.report(ctx, obs, OpCredit, r, Result{}, err, false)
	return err
}

func (l *Limiter[TTx]) creditRequest(name, key string, count float64, opts []Option, obs *observation) (request, error) {
	r, err := l.newRequest(name, key, append(opts[:len(opts):len(opts)], Count(count)))
	r.obs = obs
	return r, err
}

func (l *Limiter[TTx]) credit(ctx context.Context, tx TTx, r request) error {
	return l.store.Credit(ctx, tx, driver.CreditParams{Limit: r.limit, Count: r.count, Now: l.now()})
}

// Ping checks that the store's database answers and holds the txlimit
// table with every column this version uses, on the store's pool: call it
// at startup to fail fast. A missing or outdated table is an error matching
// ErrNotMigrated, whose message names migrations.Up. It returns ErrNoPool
// when the store has no pool.
func (l *Limiter[TTx]) Ping(ctx context.Context) error {
	var p driver.PingParams
	for _, c := range l.limits {
		p.Escrow = p.Escrow || c.Escrow
	}
	return l.store.Ping(ctx, p)
}
