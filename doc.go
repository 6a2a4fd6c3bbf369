// Package txlimit provides rate limits whose state lives in the application's
// own SQL database (PostgreSQL, MySQL/MariaDB or SQLite) and is checked and
// consumed inside the caller's transaction.
//
// Call LimitTx in the same transaction as the work the limit protects:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		res, err := limiter.LimitTx(ctx, tx, "sendMessage", userID)
//		if err != nil {
//			return err // bad input, or the database failed
//		}
//		if err := res.Err(); err != nil {
//			return err // *RateLimitedError, errors.Is(err, ErrRateLimited)
//		}
//		_, err = tx.Exec(ctx, "INSERT INTO messages (user_id, body) VALUES ($1, $2)", userID, body)
//		return err
//	})
//
// If the transaction rolls back, the tokens come back; if it commits, they
// are spent. No second system (a Redis counter) can drift from the data.
//
// # Limits
//
// A limit has a name, configured once with New (or in the call with Inline),
// and is applied per key: a user ID, an API key, an IP address; the empty key
// is one global limit for the name. Its Kind is a TokenBucket, a FixedWindow
// of Period, a SlidingWindow, or a calendar window (Daily, Weekly, Monthly,
// Yearly) in the time zone Config.Zone names (see each Kind, and
// docs/windows.md). A call consumes Count tokens (default 1), or UpTo n. When
// they are there, the result is OK; when they are not, a denial with
// RetryAfter, the time until the same request would succeed, and nothing is
// written. A count that could never succeed is an *InvalidError, not a
// denial.
//
// With Reserve a call that lacks tokens takes them anyway, into debt: the
// result is OK with RetryAfter > 0, and the work should run after RetryAfter
// without checking again (schedule it in the same transaction: a River job,
// say). Config.MaxReserved caps the debt; Credit gives tokens back.
// RetryAfter and NextToken are never negative and never more than about 146
// years (2^62 ns). Check answers what LimitTx would, taking and locking
// nothing, with the state of the limit (Result.Remaining, NextToken, At).
// With Idempotent(key, window) a call takes at most once per key within the
// window: a retry of the same request (a client's, a job's) takes nothing
// and returns the first call's Result, marked Repeat.
//
// PauseTx pauses a key until an instant (an upstream's 429 and its
// Retry-After, an operator's block): every call on it is denied until then,
// with RetryAfter the time left and Result.Paused set, whatever its tokens,
// in every process; docs/pause.md.
//
// A Concurrency limit admits at most Capacity holders of a key at once (three
// exports running per tenant): LimitTx acquires a slot for a holder id
// (Holder) in the caller's transaction, ReleaseTx gives it back, and a
// holder that neither releases nor extends (Extend) within Config.HoldFor
// loses it, reclaimed by the next acquire. At no instant do more than
// Capacity unexpired holders exist; see Concurrency and
// docs/concurrency.md.
//
// # Taking tokens: before the work, at commit, in a batch
//
// Every operation X on a limit has a form XTx that runs in a transaction the
// caller owns, and a form X that runs in a short transaction of its own on
// the store's pool; Wait, Prune, Ping and ReturnLeases run transactions of
// their own only. There are three moments to take tokens:
//
//   - Before the work: LimitTx (one limit) and LimitAllTx (several, all or
//     none). The work may use what the call says (UpTo's Result.Taken, a
//     reservation's RetryAfter).
//   - At commit: CommitTx ends a transaction the caller began, in place of
//     its Commit; Commit runs a function in a transaction of its own and
//     ends it so. The work and the tokens commit together, or neither; on
//     pgstore the takes ride the COMMIT.
//   - In the caller's pgx.Batch: pgstore.SendBatch sends the takes ahead of
//     the batch's statements, which run only when every limit granted.
//
// An option a mode cannot honour is an *InvalidError that names the mode
// that can: Reserve, UpTo and Idempotent apply before the work only. docs/usage.md has
// the table of modes and options.
//
// # Hot keys
//
// LimitTx locks the limit's rows until the caller's transaction ends, so a
// limit that many transactions share serializes them. There are two answers
// (docs/hot-keys.md). Before the work, Config.Shards spreads the limit over
// rows that calls take without waiting for one another, never admitting
// more than one unsharded limit would. At commit, Config.Lease lets Commit
// hand a key's tokens out from memory, taken from its row a slice at a
// time; LeaseAhead takes the next slice before the one held runs out.
//
// # Transactions and locks
//
// Within one call txlimit locks in one canonical order; across calls in one
// transaction the order is the caller's, and two transactions that lock the
// same rows in different orders can deadlock (retryable): take several
// limits with one LimitAllTx. Under REPEATABLE READ or SERIALIZABLE a
// concurrent update of the same limit is a serialization failure (40001),
// retryable: the stores' RunTx run the transaction again. Do not call a form
// without Tx for a key the caller's open transaction holds: it waits for
// that transaction, which waits for it. Each call reads one clock once: the
// database server's (the process's on SQLite), or Options.Clock, for tests.
// A clock that steps backwards adds nothing.
//
// # Stores and errors
//
// New infers the Limiter's transaction type from its store: pgstore.New(pool)
// (pgx v5, pgx.Tx), pgsqlstore.New(db) (PostgreSQL on database/sql, *sql.Tx),
// mysqlstore.New(db) or sqlitestore.New(db) (*sql.Tx); no other type is a
// store. The schema is goose migrations, run at setup with migrations.Up;
// Limiter.Ping checks it.
//
// A denial is not an error: Result.Err converts it to a *RateLimitedError
// (errors.Is(err, ErrRateLimited)). Errors are bad input (an *InvalidError,
// errors.As(err, new(*InvalidError)), naming the field and the fix; nothing
// was written) or the database's own, with the fix added where the cause is
// a setup mistake (ErrNotMigrated, a pooler's exec mode, SQLite's DSN).
// After an error inside a caller's transaction, roll it back. docs/usage.md
// is the manual; docs/failures.md covers failing open and retries.
package txlimit

//go:generate bash scripts/sqlc.sh generate
