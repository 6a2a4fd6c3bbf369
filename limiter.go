package txlimit

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
)

// Options configures a Limiter. The zero value is ready to use.
type Options struct {
	// Clock, when set, is read once per call and replaces the store's
	// clock: the database server's, or the process's for SQLite. Meant for
	// tests; in production the database clock keeps application servers
	// with skewed clocks in agreement.
	Clock func() time.Time

	// FailOpen chooses availability over enforcement for the forms that
	// open their own transaction to decide (Limit, LimitAll, Check, Wait):
	// when the store fails (the database is down, the pool exhausted past
	// the context's deadline, a lock timeout), they return an OK Result
	// with FailedOpen set and a nil error, consuming nothing, and the error
	// goes to the Observer. Bad input (*InvalidError), ErrNotMigrated, a
	// setup the store cannot work in (another kind of database, a DSN or
	// pooler mode it cannot use) and a cancelled context are still errors.
	// The …Tx forms never fail open (only the caller can decide what to do
	// with its failed transaction), nor does Commit. Defaults to false.
	FailOpen bool

	// Observer, when set, is told about every call of the Limiter (Event),
	// for metrics or logs (otelobserver, promobserver). It is called on the
	// caller's goroutine once the call has decided (for the …Tx forms,
	// before the caller's transaction ends; for a lease taken ahead, on the
	// goroutine that took it): it must be fast, safe for concurrent use, and
	// must not use the transaction. Without it the Limiter does no extra
	// work at all.
	Observer func(ctx context.Context, e Event)
}

// Limiter checks and consumes named limits whose state lives in a database.
// TTx is the store's transaction type (pgx.Tx for pgstore, *sql.Tx for the
// others), inferred from the store given to New. Every operation on a limit
// has two forms: XTx runs in a transaction the caller owns, so the tokens
// are spent if and only if that transaction commits; X runs in a short
// transaction of its own on the store's pool. A Limiter is safe for
// concurrent use.
type Limiter[TTx any] struct {
	store           driver.Ops[TTx]
	limits          map[string]Config
	clock           func() time.Time
	observer        func(context.Context, Event)
	failOpenOnError bool
	pruneAfter      atomic.Pointer[driver.KeyRef] // where the next Prune starts
	claimsPending   atomic.Bool                   // the next Prune starts with the idempotency keys
	leases          sync.Map                      // driver.KeyRef to its *lease (Config.Lease)
}

// New returns a Limiter on store with the named limits. Every config is
// validated; the first invalid one is returned as an *InvalidError. opts may
// be nil.
func New[TTx any](store driver.Store[TTx], limits map[string]Config, opts *Options) (*Limiter[TTx], error) {
	if isNil(store) {
		return nil, &InvalidError{Field: "store", Problem: "is nil; pass pgstore.New(pool), pgsqlstore.New(db), mysqlstore.New(db) or sqlitestore.New(db)"}
	}
	l := &Limiter[TTx]{store: driver.OpsOf(store), limits: make(map[string]Config, len(limits))}
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

// in runs do in tx when the caller gave one, and otherwise in a short
// transaction of its own, read-only when readOnly.
func in[TTx, T any](ctx context.Context, l *Limiter[TTx], tx *TTx, readOnly bool, do func(TTx) (T, error)) (T, error) {
	if tx != nil {
		return do(*tx)
	}
	var out T
	err := l.store.InTx(ctx, readOnly, func(tx TTx) (err error) {
		out, err = do(tx)
		return err
	})
	return out, storeErr(err)
}

// Limit is LimitTx in a short transaction of its own. With
// Options.FailOpen, a failure of the store grants the call (see Options).
func (l *Limiter[TTx]) Limit(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	return l.limitIn(ctx, nil, name, key, opts)
}

// LimitTx checks the limit name for key and, when the tokens are there (or
// the Reserve option allows a reservation), consumes them in tx. The tokens
// are spent if and only if tx commits. A denied call writes nothing. The
// limit's rows stay locked until tx ends, so keep the transaction short,
// or use Shards for a limit many transactions share (docs/hot-keys.md).
//
// A denial is a Result with OK false, not an error (Result.Err converts
// it). Errors are bad input (*InvalidError, nothing written) or the
// database's own (a serialization failure under REPEATABLE READ or
// SERIALIZABLE is retryable). Do not call a form without Tx for the same
// key while tx holds it: it waits for tx's row lock, and tx for it, until
// ctx ends.
func (l *Limiter[TTx]) LimitTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	return l.limitIn(ctx, &tx, name, key, opts)
}

func (l *Limiter[TTx]) limitIn(ctx context.Context, tx *TTx, name, key string, opts []Option) (Result, error) {
	r, err := l.limitRequest(name, key, opts)
	if err == nil && r.slot() {
		err = r.acquiring()
	}
	var res Result
	if err == nil {
		res, err = in(ctx, l, tx, false, func(tx TTx) (Result, error) {
			switch {
			case r.slot():
				return l.acquire(ctx, tx, r)
			case r.idempotency != nil:
				return once(ctx, l, tx, r.idempotency, "Limit", []request{r}, func() (Result, error) { return l.take(ctx, tx, r) },
					func(res Result) bool { return res.OK }, func(res *Result) { res.Repeat = true })
			}
			return l.take(ctx, tx, r)
		})
	}
	return l.finish(ctx, opLimit, r, res, err, tx == nil)
}

// take takes r's tokens in tx.
func (l *Limiter[TTx]) take(ctx context.Context, tx TTx, r request) (Result, error) {
	t, err := l.store.Take(ctx, tx, r.take())
	if err != nil {
		return Result{}, err
	}
	r.obs.addLockWait(t.LockWait)
	return r.result(t)
}

// finish ends a Limit or Check call: Options.FailOpen for a form without Tx
// (mayFailOpen), then the Observer.
func (l *Limiter[TTx]) finish(ctx context.Context, op string, r request, res Result, err error, mayFailOpen bool) (Result, error) {
	failedOpen := mayFailOpen && l.failOpen(err)
	switch {
	case failedOpen:
		res = r.failedOpen(time.Now())
	case err != nil:
		res = Result{}
	}
	res.At = res.At.UTC() // whichever clock read it
	l.report(ctx, r.obs, op, r, res, err, failedOpen)
	if failedOpen {
		return res, nil
	}
	return res, err
}

// Check is CheckTx in a short transaction of its own, after waiting for a
// lease of the key being taken ahead, so that Remaining and Leased agree.
// With Options.FailOpen, a failure of the store answers OK (see Options).
func (l *Limiter[TTx]) Check(ctx context.Context, name, key string, opts ...Option) (Result, error) {
	return l.checkIn(ctx, nil, name, key, opts)
}

// CheckTx returns the decision LimitTx would make now, taking, writing and
// locking nothing, with the state of the limit a UI draws (Remaining,
// NextToken, At; Limiter.Config gives the rest). Count(0) reads a limit
// without asking for a token. The answer may be stale by the time it is
// used; only LimitTx consumes atomically. Unlike Check, it does not wait
// for a lease being taken ahead, which may wait for tx.
func (l *Limiter[TTx]) CheckTx(ctx context.Context, tx TTx, name, key string, opts ...Option) (Result, error) {
	return l.checkIn(ctx, &tx, name, key, opts)
}

func (l *Limiter[TTx]) checkIn(ctx context.Context, tx *TTx, name, key string, opts []Option) (Result, error) {
	r, err := l.limitRequest(name, key, opts)
	if err == nil && r.idempotency != nil {
		err = refuseIdempotent(name, "Check, which takes nothing: pass it to Limit")
	}
	if err == nil && tx == nil {
		err = l.settle(ctx, driver.KeyRef{Name: r.name, Key: r.key})
	}
	var res Result
	if err == nil {
		res, err = in(ctx, l, tx, true, func(tx TTx) (Result, error) { return l.check(ctx, tx, r) })
		res.Leased = l.leased(r.name, r.key)
	}
	return l.finish(ctx, opCheck, r, res, err, tx == nil)
}

func (l *Limiter[TTx]) check(ctx context.Context, tx TTx, r request) (Result, error) {
	if r.slot() {
		return l.checkHolders(ctx, tx, r)
	}
	read, err := l.store.Read(ctx, tx, driver.ReadParams{Name: r.name, Key: r.key, Now: r.now})
	if err != nil {
		return Result{}, err
	}
	t := driver.Check(r.take(), read)
	return r.result(t)
}

// Reset is ResetTx in a short transaction of its own.
func (l *Limiter[TTx]) Reset(ctx context.Context, name, key string) error {
	return l.resetIn(ctx, nil, name, key)
}

// ResetTx deletes the state of (name, key), all shards, so that the limit is
// full again; for a Concurrency limit, every holder, so that every slot is
// free. It needs no config, so it also clears limits no longer defined.
func (l *Limiter[TTx]) ResetTx(ctx context.Context, tx TTx, name, key string) error {
	return l.resetIn(ctx, &tx, name, key)
}

func (l *Limiter[TTx]) resetIn(ctx context.Context, tx *TTx, name, key string) error {
	r := request{name: name, key: key, obs: l.observe()}
	err := validName(name)
	if err == nil {
		err = validText("key", name, key)
	}
	if err == nil {
		k := driver.KeyRef{Name: r.name, Key: r.key}
		_, err = in(ctx, l, tx, false, func(tx TTx) (struct{}, error) {
			// Holders first: acquires lock a key's holders before its rows.
			if c, known := l.limits[name]; !known || c.Kind == Concurrency {
				if err := l.store.ResetHolders(ctx, tx, k); err != nil {
					return struct{}{}, err
				}
			}
			return struct{}{}, l.store.Reset(ctx, tx, k)
		})
	}
	l.report(ctx, r.obs, opReset, r, Result{}, err, false)
	return err
}

// Credit is CreditTx in a short transaction of its own.
func (l *Limiter[TTx]) Credit(ctx context.Context, name, key string, count float64, opts ...Option) error {
	return l.creditIn(ctx, nil, name, key, count, opts)
}

// CreditTx gives count tokens back to (name, key), for example those of a
// reservation whose work was cancelled (Result.Count is what it took), never
// lifting the limit above its Capacity. Only Inline is used among opts.
// A credit is not tied to any reservation: crediting twice gives the tokens
// twice. Credit once, in the transaction that cancels the work, under a
// lock on the work's own row (a River job: when JobCancelTx reports it
// cancelled; see examples/river).
func (l *Limiter[TTx]) CreditTx(ctx context.Context, tx TTx, name, key string, count float64, opts ...Option) error {
	return l.creditIn(ctx, &tx, name, key, count, opts)
}

func (l *Limiter[TTx]) creditIn(ctx context.Context, tx *TTx, name, key string, count float64, opts []Option) error {
	r, err := l.newRequest(name, key, append(opts[:len(opts):len(opts)], Count(count)), l.observe())
	switch {
	case err == nil && r.slot():
		err = &InvalidError{Limit: name, Field: "name", Problem: "is a Concurrency limit, which has no tokens to give back: Release the holder"}
	case err == nil && r.idempotency != nil:
		err = refuseIdempotent(name, "Credit: a credit is not tied to a take; credit once, in the transaction that cancels the work")
	}
	if err == nil {
		_, err = in(ctx, l, tx, false, func(tx TTx) (struct{}, error) {
			return struct{}{}, l.store.Credit(ctx, tx, driver.CreditParams{Limit: r.limit, Count: r.count, Now: r.now})
		})
	}
	l.report(ctx, r.obs, opCredit, r, Result{}, err, false)
	return err
}

// Ping checks, on the store's pool, that the database answers and holds the
// txlimit tables (txlimit_holder and txlimit_idempotency too) with every
// column this version uses:
// call it at startup to fail fast. A missing or outdated table is an error
// matching ErrNotMigrated; another kind of database, an error naming the
// store to use; a store without a pool, an *InvalidError.
func (l *Limiter[TTx]) Ping(ctx context.Context) error {
	if err := l.store.Ping(ctx); err != nil {
		return storeErr(err)
	}
	if err := l.store.PingHolders(ctx); err != nil {
		return storeErr(err)
	}
	return storeErr(l.store.PingClaims(ctx))
}

// isNil reports whether v is nil, or a nil pointer, map, slice, channel,
// function or interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
