package sqlitestore

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"sync/atomic"
)

// stmtCache holds the store's statements prepared once on the store's
// *sql.DB. Without it modernc.org/sqlite compiles each statement of each
// LimitTx again, inside the write lock, where it delays every other writer:
// a quarter of LimitTx's CPU time. A *sql.Stmt used through tx.StmtContext
// is compiled once per connection.
type stmtCache struct {
	db *sql.DB
	// ready maps SQL text to its *sql.Stmt; pending holds the texts being
	// prepared, so that each is prepared by one goroutine at a time.
	ready   sync.Map
	pending sync.Map
	mode    atomic.Int32 // modeUnknown until learnMode reads it
}

// get returns the prepared statement for query, or nil when it is not
// prepared yet, and then may start preparing it in the background: on the
// caller's goroutine it would wait for a connection the caller may hold
// (SetMaxOpenConns(1)). Nothing is prepared until the database is known to
// be in WAL mode: in rollback-journal mode the read lock of a new
// connection can make another's COMMIT fail with SQLITE_BUSY.
func (c *stmtCache) get(query string) *sql.Stmt {
	if c == nil {
		return nil
	}
	if st, ok := c.ready.Load(query); ok {
		return st.(*sql.Stmt)
	}
	if c.mode.Load() != modeWAL {
		return nil
	}
	if _, busy := c.pending.LoadOrStore(query, true); !busy {
		go c.prepare(query)
	}
	return nil
}

// Journal modes as far as the cache knows them.
const (
	modeUnknown int32 = iota
	modeWAL
	modeOther
)

// learnMode reads the journal mode once, in tx, which must hold the write
// lock already: in a deferred transaction, a read before the write lock
// would make the lock fail with SQLITE_BUSY_SNAPSHOT. An error leaves the
// mode unknown, to be read on a later call.
func (c *stmtCache) learnMode(ctx context.Context, tx *sql.Tx) {
	if c == nil || c.mode.Load() != modeUnknown {
		return
	}
	var mode string
	if err := tx.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return
	}
	if strings.EqualFold(mode, "wal") {
		c.mode.Store(modeWAL)
	} else {
		c.mode.Store(modeOther)
	}
}

func (c *stmtCache) prepare(query string) {
	// The statement outlives the call: not the caller's context.
	st, err := c.db.PrepareContext(context.Background(), query)
	if err != nil {
		// The next call tries again (the table may not exist yet).
		c.pending.Delete(query)
		return
	}
	c.ready.Store(query, st)
}

// differentDB is the text of database/sql's unexported error for a
// statement of tx.StmtContext when tx belongs to another *sql.DB. Such a
// statement runs nothing, so the text can be run instead.
const differentDB = "statement from different database used"

func isDifferentDB(err error) bool {
	return err != nil && strings.Contains(err.Error(), differentDB)
}

// txConn is the gen.DBTX the store's queries run on: tx, through the
// prepared statements when they are ready.
type txConn struct {
	tx    *sql.Tx
	cache *stmtCache
}

// on returns the connection the generated queries run on in tx.
func (s *backend) on(tx *sql.Tx) txConn {
	return txConn{tx: tx, cache: s.stmts}
}

func (t txConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := t.cache.get(query); st != nil {
		r, err := t.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		if !isDifferentDB(err) {
			return r, err
		}
	}
	return t.tx.ExecContext(ctx, query, args...)
}

func (t txConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := t.cache.get(query); st != nil {
		rows, err := t.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
		if !isDifferentDB(err) {
			return rows, err
		}
	}
	return t.tx.QueryContext(ctx, query, args...)
}

func (t txConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := t.cache.get(query); st != nil {
		row := t.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
		if !isDifferentDB(row.Err()) {
			return row
		}
	}
	return t.tx.QueryRowContext(ctx, query, args...)
}

func (t txConn) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return t.tx.PrepareContext(ctx, query)
}
