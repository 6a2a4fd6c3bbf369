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
// are spent. There is no second system (a Redis counter) whose state can drift
// from the data it guards.
//
// # Limits
//
// A limit has a name, configured once with New (or in the call with Inline),
// and is applied per key: a user ID, an API key, an IP address; the empty key
// is one global limit for the name. Its Kind is a TokenBucket, a FixedWindow
// (of Period, or of calendar days to years in a time zone) or a
// SlidingWindow (see each, and docs/windows.md). A call consumes Count
// tokens (default 1), or UpTo n. When they are there, the result is OK; when
// they are not, a denial with RetryAfter, the time until the same request
// would succeed, and nothing is written. A count that could never succeed is
// an *InvalidError, not a denial.
//
// With Reserve a call that lacks tokens takes them anyway, into debt: the
// result is OK with RetryAfter > 0, and the work should run after RetryAfter
// without checking again (schedule it in the same transaction: a River job,
// say). Config.MaxReserved caps the debt; Credit gives tokens back.
// RetryAfter and NextToken are never negative and never more than MaxWait.
//
// # Transactions and locks
//
// Every operation X has a form XTx that runs in a transaction the caller
// owns, and a form X that runs in a short transaction of its own on the
// store's pool. LimitTx locks the limit's row until the caller's transaction
// ends: two transactions cannot both spend the same tokens, and a limit that
// many transactions share serializes them. Keep such transactions short, or
// give the limit Shards (rows a call takes without waiting for one another,
// never admitting more than one unsharded limit would; docs/hot-keys.md).
//
// To decide after the work instead, BeginFunc (or CommitTx on a transaction
// the caller began) takes the limits as the transaction commits: its work
// and the tokens commit together, or neither; on pgstore the takes ride
// the COMMIT, costing no round trip of their own, and Config.Lease keeps a
// hot key's row out of most transactions (docs/commit.md). SendBatch
// decides before the work at no round trip of its own either: on pgstore
// the takes go first in the caller's pgx.Batch, whose statements run only
// when every limit granted.
//
// Within one call txlimit locks in one canonical order; across calls in one
// transaction the order is the caller's, and two transactions that lock the
// same rows in different orders can deadlock (retryable). Take several
// limits with one LimitAllTx, all or nothing. On PostgreSQL LimitTx works
// under READ COMMITTED; under REPEATABLE READ or SERIALIZABLE a concurrent
// update of the same limit is a serialization failure (40001), retryable:
// pgstore.RunTx and pgsqlstore.RunTx run the transaction again. Do not call
// a form without Tx for a key the caller's open transaction holds: it waits
// for that transaction, which waits for it.
//
// Each call reads one clock once: the database server's (the process's on
// SQLite), so application servers with skewed clocks agree, or
// Options.Clock, for tests. A clock that steps backwards adds nothing.
//
// # Stores and errors
//
// New infers the Limiter's transaction type from its store: pgstore.New(pool)
// (pgx v5, pgx.Tx), pgsqlstore.New(db) (PostgreSQL on database/sql, *sql.Tx),
// mysqlstore.New(db) or sqlitestore.New(db) (*sql.Tx). The schema is goose migrations in package
// migrations, run at setup with migrations.Up; Limiter.Ping checks it.
//
// A denial is not an error: Result.Err converts it to a *RateLimitedError.
// Errors are bad input (*InvalidError, naming the field and the fix; nothing
// was written) or the database's own, as the driver returns them, with the
// fix added where the cause is a setup mistake (ErrNotMigrated, a pooler's
// exec mode, SQLite's DSN). After an error inside a caller's transaction,
// roll it back. docs/usage.md is the manual; docs/failures.md covers
// failing open and retries.
package txlimit

//go:generate bash scripts/sqlc.sh generate
