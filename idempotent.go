package txlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txlimit/txlimit/internal/driver"
)

// Idempotent makes a take count once per idempotency key: within window
// of the first call that took with key, a call with the same key takes
// nothing and returns that first call's Result (OK, RetryAfter, Taken,
// Remaining and At as it returned them), with Repeat set. A client's
// retry of a request whose response was lost, or a job run again after a
// timeout, is then charged once: pass the request's or the job's id.
//
// The key is claimed in the take's transaction (LimitTx's, or Limit's
// own) and the first call's result written there too, in the
// txlimit_idempotency table: a repeat that comes while the first call's
// transaction is open waits for it, and then returns its result; when
// that transaction rolls back, nothing was taken and the key is unused, and
// the repeat takes itself. A denial takes nothing and leaves the key
// unused too: a retry after RetryAfter is decided afresh. The window runs
// from the first call's clock reading; after it the key is unused again,
// and Prune deletes the expired keys.
//
// Keys are global to the table, not to a limit: a repeat must be the same
// request (the same limit, key, count, UpTo and Reserve; for LimitAll the
// same requests in the same order). One that is not is an *InvalidError
// matching ErrIdempotencyMismatch, taking nothing. Use one key per request
// of yours, not one per limit: take several limits under one key with
// LimitAll.
//
// The key is non-empty, at most 256 bytes of UTF-8 without NUL (hash a
// longer one); window is at least a microsecond and at most 100 years.
// Limit, LimitTx, LimitAll, LimitAllTx and Wait take it (in LimitAll, in
// the Options of any of the Requests, the same wherever it is given);
// CommitTx, Commit, pgstore.SendBatch, Check, Credit and Concurrency limits
// (whose Holder makes an acquire idempotent already) refuse it with an
// *InvalidError. In a transaction of yours, make the idempotent call the
// first to lock a limit's rows: a repeat waits for the first call's
// transaction while holding what it locked before.
func Idempotent(key string, window time.Duration) Option {
	return func(o *callOptions) { o.idempotency = &idempotency{key: key, window: window} }
}

// ErrIdempotencyMismatch matches (errors.Is) the *InvalidError of a call
// whose idempotency key was first used, within its window, for another
// request: the error says which.
var ErrIdempotencyMismatch = errors.New("txlimit: the idempotency key was first used for another request")

// idempotency is an Idempotent option.
type idempotency struct {
	key    string
	window time.Duration
}

// maxIdempotencyKeyLen bounds an idempotency key in bytes, so that it fits
// an index entry on every store; maxIdempotencyWindow bounds its window, so
// that its expiry fits every store's timestamps.
const (
	maxIdempotencyKeyLen = 256
	maxIdempotencyWindow = 100 * 365 * 24 * time.Hour
)

// check validates the option of the limit name.
func (k *idempotency) check(name string) error {
	switch {
	case k.key == "":
		return &InvalidError{Limit: name, Field: "Idempotent", Problem: "has an empty key; pass the id of the request or job that may be retried"}
	case len(k.key) > maxIdempotencyKeyLen:
		return invalid(name, "Idempotent", "key is %d bytes long, more than %d; hash it first (for example the hex of its SHA-256)", len(k.key), maxIdempotencyKeyLen)
	case strings.IndexByte(k.key, 0) >= 0 || !utf8.ValidString(k.key):
		return &InvalidError{Limit: name, Field: "Idempotent", Problem: "key is not UTF-8 without NUL bytes; encode it (hex, base64) first"}
	case k.window < time.Microsecond || k.window > maxIdempotencyWindow:
		return invalid(name, "Idempotent", "window must be from 1µs to 100 years, got %v; pass how long a retry of the request may come (say 24*time.Hour)", k.window)
	}
	return nil
}

// refuseIdempotent is the *InvalidError of an Idempotent option given to
// a call that does not take it (what: the call, and why).
func refuseIdempotent(name, what string) error {
	return &InvalidError{Limit: name, Field: "Idempotent", Problem: "does not apply to " + what}
}

// describe is the request a call of form (Limit or LimitAll, whose
// results differ) makes, as a repeat must make it again.
func describe(form string, rs []request) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		count := fmt.Sprintf("count %v", r.count)
		if r.upTo {
			count = fmt.Sprintf("up to %v", r.count)
		}
		if r.reserve {
			count += " reserved"
		}
		parts[i] = fmt.Sprintf("limit %q key %q %s", r.name, r.key, count)
	}
	return form + " of " + strings.Join(parts, ", ")
}

// once runs take in tx unless k was used within its window: it claims k,
// and then either returns what the first call with k returned (repeat
// marks it) or runs take, and records its result when took says it took
// something; otherwise the key stays unused.
func once[TTx, T any](ctx context.Context, l *Limiter[TTx], tx TTx, k *idempotency, form string, rs []request,
	take func() (T, error), took func(T) bool, repeat func(*T)) (T, error) {
	var zero T
	req := describe(form, rs)
	c, err := l.store.Claim(ctx, tx, driver.ClaimParams{ID: k.key, Request: req, Window: k.window, Now: rs[0].now})
	if err != nil {
		return zero, err
	}
	if !c.Fresh {
		if c.Request != req {
			return zero, &InvalidError{Limit: rs[0].name, Field: "Idempotent", kind: ErrIdempotencyMismatch, Problem: fmt.Sprintf(
				"key %q was first used within its window for %s; this call is %s: retry with the same request, or use another key for another request",
				k.key, c.Request, req)}
		}
		var out T
		if err := json.Unmarshal([]byte(c.Result), &out); err != nil {
			return zero, fmt.Errorf("txlimit: the result recorded for idempotency key %q cannot be read: %w", k.key, err)
		}
		repeat(&out)
		return out, nil
	}
	out, err := take()
	var invalid *InvalidError
	switch {
	case err == nil && took(out):
		b, err := json.Marshal(out)
		if err != nil {
			return zero, err
		}
		if err := l.store.Record(ctx, tx, driver.RecordParams{ID: k.key, Result: string(b)}); err != nil {
			return zero, err
		}
		return out, nil
	case err == nil || errors.As(err, &invalid):
		// Nothing was taken, and tx is as it was: a caller may commit it.
		// (After an error of the database, tx has failed: it is not used.)
		if rerr := l.store.Record(ctx, tx, driver.RecordParams{ID: k.key}); rerr != nil && err == nil {
			return zero, rerr
		}
	}
	return out, err
}

// idempotencyOf is the Idempotent option of a LimitAll call: that of the
// requests that give it, which must agree.
func idempotencyOf(rs []request) (*idempotency, error) {
	var k *idempotency
	for _, r := range rs {
		switch {
		case r.idempotency == nil:
		case k == nil:
			k = r.idempotency
		case *k != *r.idempotency:
			return nil, &InvalidError{Limit: r.name, Field: "Idempotent", Problem: fmt.Sprintf(
				"differs between requests (key %q for %v, key %q for %v): it is the call's; give it once, in any request", k.key, k.window, r.idempotency.key, r.idempotency.window)}
		}
	}
	return k, nil
}
