// Package sqlitestore is the SQLite store of txlimit, on database/sql. It
// imports no SQLite driver: the application opens its *sql.DB with the one
// it uses. With the pure-Go modernc.org/sqlite (driver name "sqlite"):
//
//	db, err := sql.Open("sqlite",
//		"file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//	…
//	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil { … }
//	limiter, err := txlimit.New(sqlitestore.New(db), limits, nil)
//
// With github.com/mattn/go-sqlite3 the same settings are
// "file:app.db?_busy_timeout=5000&_journal_mode=WAL&_txlock=immediate".
//
// SQLite has one writer at a time and no row locks: a transaction that
// consumes a limit takes the database's write lock before it reads the
// limit's rows, and keeps it until it ends. The DSN's settings make that
// work under concurrency: busy_timeout (a writer waits for the lock rather
// than fail with SQLITE_BUSY), WAL (readers and the writer do not block
// each other) and _txlock=immediate (a transaction that reads before it
// writes takes the write lock at BEGIN: SQLite cannot let a deferred one
// wait for it). Every connection of the pool needs them, so they belong in
// the DSN; use a file, not ":memory:" (docs/sqlite.md).
//
// Every database error, SQLITE_BUSY included, is returned as an error
// (errors.As reaches the driver's), never as a denial or a grant; roll back
// and, for SQLITE_BUSY, run the transaction again. The store reads the
// process's clock. Shards add no concurrency here, but a sharded limit
// admits exactly what the same unsharded limit would.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/internal/sqltx"
	gen "github.com/txlimit/txlimit/sqlitestore/internal/db"
)

// Store is txlimit's store for database/sql on SQLite: give it to
// txlimit.New.
type Store struct{ handle }

// handle makes Store a driver.Store.
type handle = driver.Handle[*sql.Tx]

// backend is the store's operations, and the engine's dialect: the write
// lock covers every row, so it has no shard to skip (no engine.SkipLocker).
type backend struct {
	sqltx.Store
	db      *sql.DB
	queries *gen.Queries
	stmts   *stmtCache // nil when db is
}

var (
	_ driver.Ops[*sql.Tx]     = (*backend)(nil)
	_ engine.Dialect[*sql.Tx] = (*backend)(nil)
)

// New returns a store on db, opened with any SQLite driver and configured as
// the package documentation says. db may be nil when only the …Tx forms of
// the limiter are used; the other forms then return an *txlimit.InvalidError.
//
// In WAL mode the store prepares each statement on db, in the background,
// the first time it runs it, and from then on runs it prepared in the
// caller's transaction, so that SQLite does not compile it again under the
// write lock on every call: make one Store per *sql.DB and share it. Until
// a statement is ready (preparing waits for a connection no transaction
// holds), in a transaction of another *sql.DB and in other journal modes,
// the store runs the SQL text. The statements are closed with db.
func New(db *sql.DB) *Store {
	s := &backend{db: db, queries: gen.New()}
	s.Store = sqltx.Store{DB: db, TakeAllFn: s.TakeAll, BeginErr: opErr("begin"), CommitErr: opErr("commit"),
		// In the process, with no connection to lose: a failed COMMIT did
		// not commit.
		Refused: func(error) bool { return true }}
	if db != nil {
		s.stmts = &stmtCache{db: db}
	}
	return &Store{driver.NewHandle[*sql.Tx](s)}
}

// ErrWrongDatabase matches (errors.Is) the error of a call on a *sql.DB or
// *sql.Tx that is not SQLite. Its message names the database found and the
// store to use instead.
var ErrWrongDatabase = errors.New("txlimit/sqlitestore: the database is not SQLite")

// wrap names the operation that failed and, for the errors a setup mistake
// causes, what to do about it. q, when not nil, is where the statement ran,
// to be asked which database it is (sqltx.WrongDatabase).
func wrap(ctx context.Context, q sqltx.Querier, op string, err error) error {
	if err == nil {
		return nil
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
	if wrong := sqltx.WrongDatabase(ctx, q, err, ErrWrongDatabase, sqltx.SQLite); wrong != nil {
		return wrong
	}
	return fmt.Errorf("txlimit/sqlitestore: %s: %w", op, err)
}

// pausedOf is the pause of a row read with its paused_until (µs).
func pausedOf(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return time.UnixMicro(us.Int64)
}

// clock returns now, or the process clock when now is nil, in microseconds.
func clock(now *time.Time) time.Time {
	if now != nil {
		return time.UnixMicro(now.UnixMicro())
	}
	return time.UnixMicro(time.Now().UnixMicro())
}

// opErr is wrap for an op that ran no statement.
func opErr(op string) func(context.Context, error) error {
	return func(ctx context.Context, err error) error { return wrap(ctx, nil, op, err) }
}

// Ping implements driver.Ops; it checks that db is SQLite too.
func (s *backend) Ping(ctx context.Context) error {
	if s.db == nil {
		return driver.ErrNoPool
	}
	var version string
	if err := s.db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return wrap(ctx, s.db, "ping", err)
	}
	return wrap(ctx, s.db, "ping", s.queries.ProbeTable(ctx, s.db))
}

func (s *backend) Take(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, error) {
	return engine.Take(ctx, s, tx, p)
}

func (s *backend) TakeAll(ctx context.Context, tx *sql.Tx, p driver.TakeAllParams) (driver.TakeAllResult, error) {
	return engine.TakeAll(ctx, s, tx, p)
}

func (s *backend) Credit(ctx context.Context, tx *sql.Tx, p driver.CreditParams) error {
	return engine.Credit(ctx, s, tx, p)
}

func (s *backend) Reset(ctx context.Context, tx *sql.Tx, k driver.KeyRef) error {
	return wrap(ctx, tx, "delete key", s.queries.DeleteKey(ctx, s.on(tx), gen.DeleteKeyParams{Name: k.Name, Key: k.Key}))
}

func (s *backend) Pause(ctx context.Context, tx *sql.Tx, p driver.PauseParams) error {
	return engine.Pause(ctx, s, tx, p)
}

// Prune implements driver.Ops. The batch takes the write lock, waiting up
// to busy_timeout like every writer, and then holds every row.
func (s *backend) Prune(ctx context.Context, p driver.PruneParams) (res driver.PruneResult, err error) {
	err = s.InTx(ctx, false, func(tx *sql.Tx) (err error) {
		res, err = engine.Prune(ctx, s, tx, p)
		return err
	})
	return res, err
}

// ClockRange implements driver.ClockRanger: ts is microseconds in an int64.
func (s *backend) ClockRange() (first, last time.Time) {
	return driver.Microseconds[0], driver.Microseconds[1]
}

// Read implements driver.Ops and engine.Dialect: a SELECT of tx's snapshot,
// without the write lock.
func (s *backend) Read(ctx context.Context, tx *sql.Tx, p driver.ReadParams) (driver.ReadResult, error) {
	rows, err := s.queries.ReadShards(ctx, s.on(tx), gen.ReadShardsParams{Name: p.Name, Key: p.Key})
	if err != nil {
		return driver.ReadResult{}, wrap(ctx, tx, "read shards", err)
	}
	out := driver.ReadResult{Rows: make([]driver.Row, len(rows)), At: clock(p.Now)}
	for i, r := range rows {
		out.Rows[i] = driver.Row{Shard: int32(r.Shard), Value: r.Value, Prev: r.Prev, TS: time.UnixMicro(r.Ts), Paused: pausedOf(r.PausedUntil)}
	}
	return out, nil
}

func (s *backend) TakeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (driver.TakeResult, bool, error) {
	res, ok, err := s.takeRow(ctx, tx, p, clock(p.Now))
	s.stmts.learnMode(ctx, tx)
	return res, ok, err
}

// LockKey implements engine.Dialect: TouchKey takes the write lock (on
// every row, missing ones too), waiting up to busy_timeout, and LockShards
// reads the key's rows.
func (s *backend) LockKey(ctx context.Context, tx *sql.Tx, l driver.Limit, now *time.Time, _ bool) (engine.Locked, error) {
	if err := s.queries.TouchKey(ctx, s.on(tx), gen.TouchKeyParams{Name: l.Name, Key: l.Key}); err != nil {
		return engine.Locked{}, wrap(ctx, tx, "take the write lock", err)
	}
	s.stmts.learnMode(ctx, tx)
	rows, err := s.queries.LockShards(ctx, s.on(tx), gen.LockShardsParams{Name: l.Name, Key: l.Key})
	if err != nil {
		return engine.Locked{}, wrap(ctx, tx, "read shards", err)
	}
	out := engine.Locked{Had: make([]driver.Row, len(rows)), At: clock(now)}
	for i, r := range rows {
		out.Had[i] = driver.Row{Shard: int32(r.Shard), Value: r.Value, Prev: r.Prev, TS: time.UnixMicro(r.Ts), Paused: pausedOf(r.PausedUntil)}
	}
	return out, nil
}

func (s *backend) LockKeys(ctx context.Context, tx *sql.Tx, ls []driver.Limit, now *time.Time) ([]engine.Locked, time.Time, error) {
	out := make([]engine.Locked, len(ls))
	var at time.Time
	for i, l := range ls {
		var err error
		if out[i], err = s.LockKey(ctx, tx, l, now, true); err != nil {
			return nil, time.Time{}, err
		}
		at = out[i].At
	}
	return out, at, nil
}

func (s *backend) Write(ctx context.Context, tx *sql.Tx, writes []engine.KeyWrite, deletes []engine.RowRef) (int64, error) {
	for _, w := range writes {
		paused := sql.NullInt64{Int64: w.Paused.UnixMicro(), Valid: !w.Paused.IsZero()}
		for i, st := range w.States {
			var err error
			if w.Locked.Holds(int32(i)) {
				err = s.queries.WriteShard(ctx, s.on(tx), gen.WriteShardParams{
					Name: w.Name, Key: w.Key, Shard: int64(i), Value: st.Value, Prev: st.Prev, Ts: st.TS, PausedUntil: paused,
				})
			} else {
				_, err = s.queries.InsertShard(ctx, s.on(tx), gen.InsertShardParams{
					Name: w.Name, Key: w.Key, Shard: int64(i), Value: st.Value, Prev: st.Prev, Ts: st.TS, PausedUntil: paused,
				})
			}
			if err != nil {
				return 0, wrap(ctx, tx, "write shards", err)
			}
		}
	}
	var deleted int64
	for _, r := range deletes {
		n, err := s.queries.DeleteShard(ctx, s.on(tx), gen.DeleteShardParams{Name: r.Name, Key: r.Key, Shard: int64(r.Shard)})
		if err != nil {
			return 0, wrap(ctx, tx, "delete shards", err)
		}
		deleted += n
	}
	return deleted, nil
}

func (s *backend) ScanKeys(ctx context.Context, tx *sql.Tx, after driver.KeyRef, max int) ([]engine.Key, error) {
	scanned, err := s.queries.ScanKeys(ctx, s.on(tx), gen.ScanKeysParams{AfterName: after.Name, AfterKey: after.Key, MaxKeys: int64(max)})
	keys := make([]engine.Key, len(scanned))
	for i, k := range scanned {
		keys[i].KeyRef = driver.KeyRef(k)
	}
	return keys, wrap(ctx, tx, "scan keys", err)
}

// LockIdle implements engine.Dialect: it takes the write lock and reads the
// rows of keys in one range scan of the primary key (BINARY collation: byte
// by byte). Every key is Whole.
func (s *backend) LockIdle(ctx context.Context, tx *sql.Tx, keys []engine.Key, now *time.Time) ([]engine.Held, time.Time, error) {
	first, last := keys[0], keys[len(keys)-1]
	if err := s.queries.TouchKey(ctx, s.on(tx), gen.TouchKeyParams(first.KeyRef)); err != nil {
		return nil, time.Time{}, wrap(ctx, tx, "take the write lock", err)
	}
	rows, err := s.queries.RowsBetween(ctx, s.on(tx), gen.RowsBetweenParams{
		FirstName: first.Name, FirstKey: first.Key, LastName: last.Name, LastKey: last.Key,
	})
	if err != nil {
		return nil, time.Time{}, wrap(ctx, tx, "read idle keys", err)
	}
	index := make(map[driver.KeyRef]int, len(keys))
	held := make([]engine.Held, len(keys))
	for i, k := range keys {
		index[k.KeyRef] = i
		held[i] = engine.Held{KeyRef: k.KeyRef, Whole: true}
	}
	for _, r := range rows {
		if i, ok := index[driver.KeyRef{Name: r.Name, Key: r.Key}]; ok {
			held[i].Rows = append(held[i].Rows, driver.Row{Shard: int32(r.Shard), Value: r.Value, Prev: r.Prev, TS: time.UnixMicro(r.Ts), Paused: pausedOf(r.PausedUntil)})
		}
	}
	return held, clock(now), nil
}
