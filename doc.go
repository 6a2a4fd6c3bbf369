// Package txlimit provides rate limits whose state lives in the application's
// own SQL database (PostgreSQL or SQLite) and is checked and consumed inside
// the caller's transaction.
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
// A limit has a name, configured once with New (or inline with Inline),
// and is applied per key: a user ID, an API key, an IP address; the empty key
// is one global limit for the name. Two kinds:
//
//   - TokenBucket adds Rate tokens per Period continuously, up to Capacity.
//     Smooth; Capacity above Rate allows bursts after idle time.
//   - FixedWindow adds Rate tokens at the start of each window of Period, up to
//     Capacity. Windows align to Config.Start, or, when it is zero, to an
//     offset derived from a hash of the name and key, so that the resets of
//     many keys do not all fall on the same instant.
//
// A call consumes Count tokens (default 1). When they are there, the result is
// OK. When they are not, the result is a denial with RetryAfter, the time until
// the same request would succeed, and nothing is written. A count that could
// never succeed (above Capacity) is an *InvalidError, not a denial.
//
// # Reservations
//
// With the Reserve option a call that lacks tokens takes them anyway, into
// debt: the result is OK with RetryAfter > 0, meaning the tokens are yours and
// the work should run after RetryAfter without checking the limit again.
// Schedule the work (a job queue row, for example a River job with
// ScheduledAt) in the same transaction, so that the reservation and the job
// commit or roll back together. Config.MaxReserved caps the debt; Credit gives
// back the tokens of work that was cancelled. A reservation is never a
// denial: Result.Err is nil for it. The one exception is bad input: a
// reservation whose wait would reach MaxWait (about 146 years; Count(3e6) on
// a limit of one token an hour) or whose debt would leave float64's range is
// an *InvalidError for Count, and nothing is taken; MaxReserved prevents it.
//
// # Waits
//
// RetryAfter and NextToken are never negative and never more than MaxWait,
// half the range of time.Duration, so that At + RetryAfter, jitter.Spread and the
// Retry-After of package httplimit never overflow. A denial whose wait is
// longer (a Rate of 1e-300, a Period of a century and a large count) reports
// MaxWait.
//
// # Transactions and locks
//
// Every operation X has a form XTx that runs in a transaction the caller owns,
// and a form X that runs in a short transaction of its own on the store's pool
// (or database). LimitTx locks the limit's row until the caller's transaction
// ends: two transactions cannot both spend the same tokens, and a limit that
// many transactions share serializes them. On an unsharded limit an admitted
// call is one statement (INSERT … ON CONFLICT DO UPDATE … RETURNING on
// PostgreSQL and SQLite) that locks or creates the row, refills it, decides
// and writes with the database's clock; a denial writes nothing and costs
// one more read. Keep such transactions short, or give the limit Shards: a sharded limit
// keeps its tokens in several rows, and a call takes a row no other
// transaction holds (FOR UPDATE SKIP LOCKED), falling back to all rows, locked
// in order, when one row alone lacks the tokens. Across all shards never more
// is admitted than one unsharded limit of the same configuration would admit.
//
// On PostgreSQL a limit may instead be in escrow mode (Config.Escrow): the
// call inserts a claim row in the caller's transaction and takes the tokens
// in a statement of its own on the store's pool, which commits at once, so
// the caller never holds the limit's row; settlement (Limiter.Settle, and
// each call for its own key) gives the tokens of a transaction that did not
// commit its claim back, late but never early (docs/escrow.md).
//
// Locks taken by LimitTx are the caller's transaction's own locks, and the
// usual rule for row locks applies: two transactions that lock the same rows
// in different orders can deadlock (PostgreSQL detects it after
// deadlock_timeout and aborts one with SQLSTATE 40P01, retryable). Within one
// call txlimit always locks in one canonical order. Across calls in one
// transaction, the order is the caller's: to consume several limits, or the
// same sharded limit several times, in one transaction, use a single call
// (Count(n) for n tokens of one limit) rather than a sequence of calls in
// varying orders. LimitAllTx takes several limits in one call, all or
// nothing, locking every row in one canonical order.
//
// On PostgreSQL LimitTx works under READ COMMITTED. Under REPEATABLE READ or
// SERIALIZABLE a concurrent update of the same limit makes the database
// return a serialization failure (SQLSTATE 40001), which is retryable: run
// the whole transaction again. It never admits wrongly.
//
// # Waiting
//
// Wait is for callers that would rather wait than be denied, as
// x/time/rate's Limiter.Wait: it calls Limit, and after a denial sleeps the
// RetryAfter plus jitter, holding no transaction, and tries again until the
// tokens are granted or the context ends. It returns at once when the wait
// would outlast the context's deadline. For transactions that fail with a
// serialization failure or a deadlock, pgstore.RunTx runs them again
// (pgsqlstore.RunTx for a *sql.Tx).
//
// # Time
//
// Each call reads one clock once. By default it is the database server's
// (clock_timestamp() on PostgreSQL; the process clock for SQLite, which has no
// server), so application servers with skewed clocks agree. Options.Clock
// replaces it, for tests. State is kept at microsecond precision. A clock
// that steps backwards adds no tokens, and the time it went back is never
// credited twice.
//
// # Stores
//
// A Limiter is generic over the store's transaction type and is built from a
// store, which fixes it:
//
//   - pgstore.New(pool): PostgreSQL on pgx v5; TTx is pgx.Tx.
//   - pgsqlstore.New(db): PostgreSQL on database/sql (lib/pq, pgx's stdlib
//     driver, and sqlx, GORM, bun or ent on them); TTx is *sql.Tx. The same
//     SQL as pgstore; prefer pgstore when the application has pgx.Tx, since
//     pgx sends a sharded call's statements in one batch.
//   - sqlitestore.New(db): SQLite on database/sql; TTx is *sql.Tx.
//
// Users never write the type parameter: txlimit.New infers it from the
// store, and handing LimitTx a transaction of another type does not compile
// ("cannot use tx (variable of type *sql.Tx) as pgx.Tx value"). Both
// database/sql stores take *sql.Tx, so a mix-up between them is seen at run
// time instead: pgsqlstore on SQLite or MySQL, or sqlitestore on PostgreSQL,
// returns an error naming the database and the store to use, from Ping and
// from the first call. Each store does every operation whole, in the
// caller's transaction, with its database's own locking (package driver is
// that seam; it is not an API to implement). The schema is a goose
// migration in package migrations, which the application runs at setup with
// migrations.Up; Limiter.Ping checks it at startup.
//
// # Errors
//
// A denial is not an error: LimitTx returns a Result with OK false, and
// Result.Err converts it to a *RateLimitedError for code that prefers errors.
// Errors returned by the methods are bad input (*InvalidError, which names the
// field and the fix; nothing was written) or the database's own, returned as
// the driver returns them so that callers can classify them (pgconn.PgError
// and its SQLSTATE, context errors), with the fix added where the cause is a
// setup mistake: ErrNotMigrated for a missing table, the exec modes that work
// behind a transaction-mode pooler, the DSN settings for SQLite's "database is
// locked". After an error inside a caller's transaction, roll that
// transaction back.
//
// A form without Tx (Limit, Check, Value, ...) runs in a transaction of its
// own: calling it for a key that the caller's open transaction already holds
// (after a LimitTx on it) waits for that transaction's row lock, which is
// released only when the caller, who is waiting too, ends: the call returns
// only when its context does. Inside a transaction, use the …Tx forms.
package txlimit

//go:generate bash scripts/sqlc.sh generate
