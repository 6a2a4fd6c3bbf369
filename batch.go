package txlimit

import (
	"context"
	"fmt"
	"reflect"

	"github.com/txlimit/txlimit/internal/driver"
)

// SendBatch takes the limits of reqs in tx, all or none as LimitAllTx
// takes them, ahead of the statements queued in b, the caller's own batch,
// and then runs those statements in tx, in their order, with their own
// callbacks. It is for work that must not run without its tokens, as with
// LimitTx, without a round trip for the take: on pgstore (b a *pgx.Batch)
// the takes and b's statements go to the server together, and a take that
// would grant nothing stops the batch there, before any of b's statements
// takes effect. The caller then commits tx: the tokens are spent if and
// only if tx commits. The limits' rows stay locked until tx ends, as
// LimitTx's do: send the batch late in the transaction.
//
// The error is nil if and only if every limit granted and b's statements
// ran. A denial returns the MultiResult (OK false; each Result is what
// Check would say of its limit) and its Err, a *RateLimitedError with the
// RetryAfter: none of b's statements took effect and none of their
// callbacks was called, and tx has been rolled back (pgx's Rollback then
// returns pgx.ErrTxClosed). An error of b's statements (a callback's, or
// the server's) is returned as it is, after the takes: roll tx back and
// the tokens come back with it. Bad input is an *InvalidError returned
// before anything is sent, tx left as it was; so is a store that cannot
// send b (database/sql sends one statement at a time: on pgsqlstore,
// sqlitestore and mysqlstore take the limits with LimitTx or LimitAllTx
// before the statements), a nil b, Reserve and UpTo (a reservation tells
// when to run work that is queued already, and UpTo's grant cannot size
// statements queued already). After any other error, roll tx back.
// SendBatch never fails open.
//
// On pgstore, when every limit is an unsharded token bucket or fixed
// window, the takes are the first statements of the batch,
// sent as CommitTx sends them with its COMMIT, so that the whole call is
// one round trip. Other limits are taken first as LimitAllTx takes them,
// and b is sent once they granted. A limit with Config.Lease is taken from
// its row, as under CommitTx. pgstore refuses a savepoint (tx.Begin) for
// tx, since a denial rolls back the whole transaction. docs/commit.md
// compares the modes.
//
// SendBatch is a function, not a method, because its batch type is a type
// parameter of its own, inferred from b.
func SendBatch[TTx, TBatch any](ctx context.Context, l *Limiter[TTx], tx TTx, b TBatch, reqs ...Request) (MultiResult, error) {
	sender, ok := any(l.store).(driver.BatchSender[TTx, TBatch])
	check := func() error {
		switch {
		case !ok:
			return &InvalidError{Field: "batch", Problem: fmt.Sprintf("of type %T cannot be sent by this store (%T): "+
				"SendBatch needs pgstore and a *pgx.Batch; database/sql stores (pgsqlstore, sqlitestore, mysqlstore) "+
				"send one statement at a time: take the limits with LimitTx or LimitAllTx before the statements instead", b, l.store)}
		case isNil(b):
			return &InvalidError{Field: "batch", Problem: "is nil; pass the batch whose statements the limits guard " +
				"(an empty one takes the limits alone)"}
		}
		return nil
	}
	return l.takeWith(ctx, opBatch, inBatch, reqs, check, false, func(p driver.TakeAllParams) (driver.TakeAllResult, error) {
		return sender.SendBatch(ctx, tx, b, p)
	})
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
