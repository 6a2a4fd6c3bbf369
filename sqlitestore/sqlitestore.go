// Package sqlitestore is the SQLite store of txlimit, on database/sql.
//
// It imports no SQLite driver: the application opens its *sql.DB with the
// driver it already uses and passes it to New. With the pure-Go
// modernc.org/sqlite driver (driver name "sqlite"):
//
//	db, err := sql.Open("sqlite",
//		"file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//	…
//	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil { … }
//	limiter, err := txlimit.New(sqlitestore.New(db), limits, nil)
//
// The limiter's TTx is then *sql.Tx, and LimitTx takes the transaction the
// application already has open. With github.com/mattn/go-sqlite3 the same
// settings are "file:app.db?_busy_timeout=5000&_journal_mode=WAL&_txlock=immediate".
//
// SQLite has one writer at a time and no row locks: a transaction that
// consumes a limit takes the database's write lock before it reads the
// limit's rows, and keeps it until it ends. The DSN's three settings make
// that work under concurrency: busy_timeout, so that a writer waits for the
// lock instead of failing with SQLITE_BUSY; WAL, so that readers and the
// writer do not block each other; and _txlock=immediate, so that a
// transaction that reads before it writes takes the write lock at BEGIN
// (SQLite cannot let a deferred one wait for it). Every connection of the
// pool needs them, so they belong in the DSN; use a file, not ":memory:".
// docs/sqlite.md says why for each.
//
// SQLITE_BUSY and every other database error is returned as an error, whose
// driver error errors.As reaches, never a denial or a grant; roll back and,
// for SQLITE_BUSY, run the transaction again. SQLite has no server clock: the
// store reads the process's, and txlimit.Options.Clock replaces it. Shards
// add no concurrency here (the write lock covers every row), but a sharded
// limit admits exactly what the same unsharded limit would.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
	gen "github.com/txlimit/txlimit/sqlitestore/internal/db"
)

// Store is txlimit's store for database/sql on SQLite: give it to txlimit.New, which
// reaches it through the Limiter only.
type Store struct{ handle }

// handle makes Store the driver.Store that txlimit.New takes: sealed, so
// that no other package implements one.
type handle = driver.Handle[*sql.Tx]

// backend is the store's operations.
type backend struct {
	db      *sql.DB
	queries *gen.Queries
	stmts   *stmtCache // nil when db is
}

var _ driver.Ops[*sql.Tx] = (*backend)(nil)

// New returns a store on db, opened with any SQLite driver and configured as
// the package documentation says. db may be nil when only the …Tx forms of
// the limiter are used; the other forms then return txlimit.ErrNoPool.
//
// In WAL mode the store prepares its statements on db the first time it
// runs them (in the background, on a connection of the pool, once per
// Store: make one Store per *sql.DB and share it) and from then on runs them
// prepared in the caller's transaction, so that SQLite does not compile the
// same SQL again, under the write lock, on every call. Preparing takes a
// connection of the pool that no transaction holds: while every connection
// is held (SetMaxOpenConns(1) and a transaction open, say), the calls run the
// text until one is free. The statements are closed with db. A transaction
// of another *sql.DB, one that comes before a statement is ready, and every
// transaction on a database in another journal mode run the SQL text as it
// is.
func New(db *sql.DB) *Store {
	s := &backend{db: db, queries: gen.New()}
	if db != nil {
		s.stmts = &stmtCache{db: db}
	}
	return &Store{driver.NewHandle[*sql.Tx](s)}
}

// ErrWrongDatabase matches (errors.Is) the error of a call on a *sql.DB or
// *sql.Tx that is not SQLite, such as PostgreSQL's; the message names the
// store to use instead.
var ErrWrongDatabase = errors.New("the database is not SQLite")

// wrap names the operation that failed and, for the errors a setup mistake
// causes, what to do about it; errors.As still reaches the driver's error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	// SQLite's errors carry no SQLSTATE; PostgreSQL's drivers (pgx's
	// *pgconn.PgError, lib/pq's *pq.Error) give theirs by this method.
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return fmt.Errorf("txlimit/sqlitestore: %s: %w: the database answered with SQLSTATE %s, so it is PostgreSQL, "+
			"not SQLite; use pgsqlstore.New(db) for PostgreSQL on database/sql (*sql.Tx), or pgstore.New(pool) for pgx: %w",
			op, ErrWrongDatabase, pgErr.SQLState(), err)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column named"):
		return fmt.Errorf("txlimit/sqlitestore: %s: %w: %w", op, driver.ErrNotMigrated, err)
	case strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY"):
		return fmt.Errorf("txlimit/sqlitestore: %s: another connection held the write lock; roll back and retry the "+
			"transaction, and open the database with busy_timeout, WAL and _txlock=immediate in the DSN "+
			"(see the sqlitestore package documentation): %w", op, err)
	}
	return fmt.Errorf("txlimit/sqlitestore: %s: %w", op, err)
}

// clock returns now, or the process clock when now is nil, at microsecond
// precision (the precision of the stored ts).
func clock(now *time.Time) time.Time {
	if now != nil {
		return time.UnixMicro(now.UnixMicro())
	}
	return time.UnixMicro(time.Now().UnixMicro())
}

// InTx implements driver.Store. A transaction that will write is begun
// with default options, so the DSN's _txlock decides whether it is
// IMMEDIATE; one that only reads (Check, Value) is begun read-only, which
// modernc.org/sqlite begins without taking the write lock. It is rolled back
// when fn returns an error or panics (the panic then continues) and
// committed otherwise.
func (s *backend) InTx(ctx context.Context, readOnly bool, fn func(tx *sql.Tx) error) error {
	return sqltx.InTx(ctx, s.db, readOnly, fn,
		func(err error) error { return wrap("begin", err) },
		s.commitErr)
}

// Commit implements driver.Store: TakeAll, then COMMIT or ROLLBACK. SQLite
// has no round trip to save, and a COMMIT that fails did not commit.
func (s *backend) Commit(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return sqltx.Commit(ctx, tx, p, s.TakeAll, s.commitErr, known)
}

// InTxCommit implements driver.Store.
func (s *backend) InTxCommit(ctx context.Context, fn func(tx *sql.Tx) error, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return sqltx.InTxCommit(ctx, s.db, fn, p, s.TakeAll, func(err error) error { return wrap("begin", err) }, s.commitErr, known)
}

func (s *backend) commitErr(err error) error { return wrap("commit", err) }

// known reports that a COMMIT that failed did not commit: SQLite runs in
// the process, with no connection to lose.
func known(error) bool { return true }

// Ping implements driver.Store: it checks that db is SQLite and that the
// txlimit table is there with every column the library uses.
func (s *backend) Ping(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	var version string
	if err := s.db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		if err := wrap("ping", err); errors.Is(err, ErrWrongDatabase) {
			return err
		}
		return fmt.Errorf("txlimit/sqlitestore: ping: %w: sqlite_version() failed, so this is another database "+
			"(for PostgreSQL, use pgsqlstore.New(db)): %w", ErrWrongDatabase, err)
	}
	return wrap("ping", s.queries.ProbeTable(ctx, s.db))
}

// lockKey takes SQLite's write lock for tx, waiting up to busy_timeout (a
// no-op when tx holds it already), then reads every row of (name, key) and
// the clock. The write lock locks every row of the database, so the rows
// cannot change before tx ends.
func (s *backend) lockKey(ctx context.Context, tx *sql.Tx, name, key string, now *time.Time) ([]driver.Row, time.Time, error) {
	if err := s.queries.TouchKey(ctx, s.on(tx), gen.TouchKeyParams{Name: name, Key: key}); err != nil {
		return nil, time.Time{}, wrap("take the write lock", err)
	}
	s.stmts.learnMode(ctx, tx)
	rows, err := s.queries.LockShards(ctx, s.on(tx), gen.LockShardsParams{Name: name, Key: key})
	if err != nil {
		return nil, time.Time{}, wrap("read shards", err)
	}
	out := make([]driver.Row, len(rows))
	for i, r := range rows {
		out[i] = driver.Row{Shard: int32(r.Shard), Value: r.Value, Prev: r.Prev, TS: time.UnixMicro(r.Ts)}
	}
	return out, clock(now), nil
}

// store writes states to rows 0..Shards-1 of l's key, whose rows were had:
// it creates the rows that are missing and deletes those beyond Shards (a
// limit redeployed with other Shards).
func (s *backend) store(ctx context.Context, tx *sql.Tx, l driver.Limit, had []driver.Row, states []algo.State) error {
	exists := make([]bool, len(states))
	for _, r := range had {
		if int(r.Shard) < len(exists) {
			exists[r.Shard] = true
		}
	}
	for i, st := range states {
		var err error
		if exists[i] {
			err = s.queries.WriteShard(ctx, s.on(tx), gen.WriteShardParams{
				Name: l.Name, Key: l.Key, Shard: int64(i), Value: st.Value, Prev: st.Prev, Ts: st.TS,
			})
		} else {
			_, err = s.queries.InsertShard(ctx, s.on(tx), gen.InsertShardParams{
				Name: l.Name, Key: l.Key, Shard: int64(i), Value: st.Value, Prev: st.Prev, Ts: st.TS,
			})
		}
		if err != nil {
			return wrap("write shards", err)
		}
	}
	for _, shard := range driver.Extra(had, l.Shards) {
		if _, err := s.queries.DeleteShard(ctx, s.on(tx), gen.DeleteShardParams{Name: l.Name, Key: l.Key, Shard: int64(shard)}); err != nil {
			return wrap("delete shards", err)
		}
	}
	return nil
}

// Take implements driver.Store. On an unsharded limit it runs one
// statement that refills, decides and writes (takeRowSQL); when that grants
// nothing, and on a sharded limit, every shard of the limit is read under
// the write lock, decided on in Go and written. There is no row lock to
// skip, so a sharded limit is never served from one shard.
func (s *backend) Take(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	var start time.Time
	if p.TimeLocks {
		start = time.Now()
	}
	if p.Shards == 1 && driver.InSQL(p) {
		res, done, err := s.takeRow(ctx, tx, p, clock(p.Now))
		if err != nil || done {
			if p.TimeLocks {
				res.LockWait = time.Since(start)
			}
			s.stmts.learnMode(ctx, tx)
			return res, err
		}
	}
	rows, at, err := s.lockKey(ctx, tx, p.Name, p.Key, p.Now)
	if err != nil {
		return driver.TakeResult{}, err
	}
	res, write := driver.Decide(p, rows, at)
	if p.TimeLocks {
		res.LockWait = time.Since(start)
	}
	if write {
		if err := s.store(ctx, tx, p.Limit, rows, res.States); err != nil {
			return driver.TakeResult{}, err
		}
	}
	return res, nil
}

// TakeAll implements driver.Store. The write lock locks every row at once,
// so the order does not matter here; the keys are still read in the
// canonical order.
func (s *backend) TakeAll(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	var start time.Time
	if p.TimeLocks {
		start = time.Now()
	}
	rows := make([][]driver.Row, len(p.Takes))
	var at time.Time
	for _, i := range driver.CanonicalOrder(p.Takes) {
		var err error
		if rows[i], at, err = s.lockKey(ctx, tx, p.Takes[i].Name, p.Takes[i].Key, p.Now); err != nil {
			return driver.TakeAllResult{}, err
		}
	}
	var lockWait time.Duration
	if p.TimeLocks {
		lockWait = time.Since(start)
	}
	out, writes := driver.DecideAll(p, rows, at)
	out.LockWait = lockWait
	for i, t := range p.Takes {
		if writes[i] != nil {
			if err := s.store(ctx, tx, t.Limit, rows[i], out.Results[i].States); err != nil {
				return driver.TakeAllResult{}, err
			}
		}
	}
	return out, nil
}

// Read implements driver.Store with a plain SELECT, which takes no write
// lock: it sees tx's snapshot (and tx's own writes).
func (s *backend) Read(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	rows, err := s.queries.ReadShards(ctx, s.on(tx), gen.ReadShardsParams{Name: p.Name, Key: p.Key})
	if err != nil {
		return driver.ReadResult{}, wrap("read shards", err)
	}
	out := driver.ReadResult{Rows: make([]driver.Row, len(rows)), At: clock(p.Now)}
	for i, r := range rows {
		out.Rows[i] = driver.Row{Shard: int32(r.Shard), Value: r.Value, Prev: r.Prev, TS: time.UnixMicro(r.Ts)}
	}
	return out, nil
}

// Credit implements driver.Store. A key with no row is full: there is
// nothing to give back to it.
func (s *backend) Credit(ctx context.Context, tx *sql.Tx, p driver.CreditParams) error {
	rows, at, err := s.lockKey(ctx, tx, p.Name, p.Key, p.Now)
	if err != nil || len(rows) == 0 {
		return err
	}
	return s.store(ctx, tx, p.Limit, rows, driver.CreditStates(p, rows, at))
}

// Reset implements driver.Store.
func (s *backend) Reset(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	return wrap("delete key", s.queries.DeleteKey(ctx, s.on(tx), gen.DeleteKeyParams{Name: k.Name, Key: k.Key}))
}

// Prune implements driver.Store. SQLite cannot pass over rows that another
// transaction holds: the batch takes the write lock, waiting up to
// busy_timeout like every writer, and then holds every row. The rows of the
// batch's keys are read in one range scan of the primary key (SQLite's
// BINARY collation: byte by byte), from the first key to the last.
func (s *backend) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		res, err = s.prune(ctx, tx, p)
		return err
	})
	return res, err
}

func (s *backend) prune(ctx context.Context, tx *sql.Tx, p driver.PruneParams) (driver.PruneResult, error) {
	keys, err := s.queries.ScanKeys(ctx, s.on(tx), gen.ScanKeysParams{AfterName: p.After.Name, AfterKey: p.After.Key, MaxKeys: int64(p.Max)})
	if err != nil || len(keys) == 0 {
		return driver.PruneResult{}, wrap("scan keys", err)
	}
	out := driver.PruneResult{Keys: len(keys), Last: driver.KeyRef{Name: keys[len(keys)-1].Name, Key: keys[len(keys)-1].Key}}
	known := make(map[driver.KeyRef]bool, len(keys))
	for _, k := range keys {
		if p.Known(k.Name) {
			known[driver.KeyRef{Name: k.Name, Key: k.Key}] = true
		} else {
			out.Unknown++
		}
	}
	if len(known) == 0 {
		return out, nil
	}
	first, last := keys[0], keys[len(keys)-1]
	if err := s.queries.TouchKey(ctx, s.on(tx), gen.TouchKeyParams(first)); err != nil {
		return driver.PruneResult{}, wrap("take the write lock", err)
	}
	rows, err := s.queries.RowsBetween(ctx, s.on(tx), gen.RowsBetweenParams{
		FirstName: first.Name, FirstKey: first.Key, LastName: last.Name, LastKey: last.Key,
	})
	if err != nil {
		return driver.PruneResult{}, wrap("read idle keys", err)
	}
	at := clock(p.Now)
	for i := 0; i < len(rows); {
		j := i
		var keyRows []driver.Row
		for ; j < len(rows) && rows[j].Name == rows[i].Name && rows[j].Key == rows[i].Key; j++ {
			keyRows = append(keyRows, driver.Row{Shard: int32(rows[j].Shard), Value: rows[j].Value, Prev: rows[j].Prev, TS: time.UnixMicro(rows[j].Ts)})
		}
		k := driver.KeyRef{Name: rows[i].Name, Key: rows[i].Key}
		if known[k] && p.Full(k.Name, k.Key, keyRows, at) {
			for _, r := range keyRows {
				n, err := s.queries.DeleteShard(ctx, s.on(tx), gen.DeleteShardParams{Name: k.Name, Key: k.Key, Shard: int64(r.Shard)})
				if err != nil {
					return driver.PruneResult{}, wrap("delete shards", err)
				}
				out.Deleted += int(n)
			}
		}
		i = j
	}
	return out, nil
}

// ClockRange implements driver.ClockRanger: ts is microseconds in an int64.
func (s *backend) ClockRange() (first, last time.Time) {
	return driver.Microseconds[0], driver.Microseconds[1]
}
