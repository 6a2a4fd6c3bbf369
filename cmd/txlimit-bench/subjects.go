package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // the pure-Go SQLite driver, registered as "sqlite"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/benchfloor"
	"github.com/txlimit/txlimit/migrations"
)

// The floor's own statements are benchfloor's; the sharded floor and the
// business write are the command's.
const (
	// The sharded floor: the same rows per shard as txlimit's table, and
	// the statement a careful hand would write to take a free one: the
	// first row no other transaction holds going up from a random shard,
	// then on from shard 0, read in index order (see TryLockShard in
	// queries/postgres/txlimit.sql); when every row is held, wait for the
	// random one.
	pgShardFloorDDL = `CREATE TABLE floor_shards (k text NOT NULL, shard integer NOT NULL,
		value double precision NOT NULL, ts timestamptz NOT NULL, PRIMARY KEY (k, shard))`
	pgShardFloorInsert = `INSERT INTO floor_shards (k, shard, value, ts)
		SELECT $1, s, $2, $3 FROM generate_series(0, $4::integer - 1) AS s ON CONFLICT DO NOTHING`
	pgShardFloorTry = `WITH a AS MATERIALIZED (
		SELECT shard, value, ts FROM floor_shards WHERE k = $1 AND shard >= $2 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED
	), b AS MATERIALIZED (
		SELECT shard, value, ts FROM floor_shards WHERE k = $1 AND shard < $2 ORDER BY shard LIMIT 1 FOR UPDATE SKIP LOCKED
	)
	SELECT shard, value, ts FROM a UNION ALL SELECT shard, value, ts FROM b LIMIT 1`
	pgShardFloorWait   = `SELECT shard, value, ts FROM floor_shards WHERE k = $1 AND shard = $2 FOR UPDATE`
	pgShardFloorUpdate = `UPDATE floor_shards SET value = $3, ts = $4 WHERE k = $1 AND shard = $2`

	// The business write of the business scenario on SQLite (PostgreSQL's
	// is benchfloor.PGBusinessDDL and PGBusinessInsert).
	sqliteBusinessDDL    = `CREATE TABLE bench_orders (id INTEGER PRIMARY KEY, k TEXT NOT NULL, amount INTEGER NOT NULL)`
	sqliteBusinessInsert = `INSERT INTO bench_orders (k, amount) VALUES (?, ?)`
)

// floorKey is the floor's row of key in a run.
func floorKey(spec limitSpec, key string) string { return spec.Name + "/" + key }

// --- PostgreSQL ---

// pgEnv is the bench's schema on the PostgreSQL server.
type pgEnv struct {
	dsn     string
	schema  string
	version string
}

// openPostgres creates a schema of its own on the server of dsn with
// txlimit's migrations and the floor's table in it. drop removes it.
func openPostgres(ctx context.Context, dsn string) (env *pgEnv, drop func(), err error) {
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to -dsn: %w", err)
	}
	defer admin.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	env = &pgEnv{dsn: dsn, schema: "txlimit_bench_" + hex.EncodeToString(b)}
	if err := admin.QueryRow(ctx, "SELECT version()").Scan(&env.version); err != nil {
		return nil, nil, err
	}
	ident := pgx.Identifier{env.schema}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return nil, nil, fmt.Errorf("create schema %s: %w", env.schema, err)
	}
	drop = func() {
		// The run's context may be cancelled by now; the schema goes anyway.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			fmt.Fprintf(os.Stderr, "txlimit-bench: could not drop schema %s: %v\n", env.schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "txlimit-bench: could not drop schema %s: %v\n", env.schema, err)
		}
	}
	pool, err := env.pool(ctx, 2, false)
	if err != nil {
		drop()
		return nil, nil, err
	}
	defer pool.close()
	db := stdlib.OpenDBFromPool(pool.pool)
	defer db.Close()
	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		drop()
		return nil, nil, err
	}
	for _, ddl := range []string{benchfloor.PGDDL, pgShardFloorDDL, benchfloor.PGBusinessDDL} {
		if _, err := pool.pool.Exec(ctx, ddl); err != nil {
			drop()
			return nil, nil, fmt.Errorf("create the floor's and the business tables: %w", err)
		}
	}
	for _, ddl := range tpcbDDL {
		if _, err := pool.pool.Exec(ctx, ddl); err != nil {
			drop()
			return nil, nil, fmt.Errorf("create pgbench's tables: %w", err)
		}
	}
	return env, drop, nil
}

// pgPool is a pool on the bench's schema with a tracer that counts what its
// connections send.
type pgPool struct {
	pool  *pgxpool.Pool
	trace *tracer
}

// pool is a pool of conns connections whose statements its tracer counts
// (and, with timing, times).
func (e *pgEnv) pool(ctx context.Context, conns int, timing bool) (*pgPool, error) {
	t := &tracer{timing: timing, spent: map[string]time.Duration{}}
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse -dsn: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = e.schema
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.Tracer = t
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &pgPool{pool: pool, trace: t}, nil
}

func (p *pgPool) close() { p.pool.Close() }

// tracer counts the queries and batches (each one round trip once the
// statements are cached) that a pool's connections send, and how many times
// pgstore rolled a sharded limit's fast path back to its savepoint, that is
// how many calls went on to lock every shard. With timing set it also adds
// up the time spent in each kind of statement, as the client sees it (the
// round trip and any lock wait included): the -profile breakdown.
type tracer struct {
	queries, batches, undos atomic.Int64
	// redis counts the commands sent to Redis (see redisHook).
	redis atomic.Int64

	timing bool
	mu     sync.Mutex
	spent  map[string]time.Duration
}

type traceStart struct{}

type started struct {
	label string
	at    time.Time
}

func (t *tracer) reset() {
	t.queries.Store(0)
	t.batches.Store(0)
	t.undos.Store(0)
	t.redis.Store(0)
	t.mu.Lock()
	t.spent = map[string]time.Duration{}
	t.mu.Unlock()
}

// profile returns the time spent per kind of statement since reset.
func (t *tracer) profile() map[string]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.spent)
}

func (t *tracer) start(ctx context.Context, label string) context.Context {
	if !t.timing {
		return ctx
	}
	return context.WithValue(ctx, traceStart{}, started{label, time.Now()})
}

func (t *tracer) end(ctx context.Context) {
	s, ok := ctx.Value(traceStart{}).(started)
	if !ok {
		return
	}
	d := time.Since(s.at)
	t.mu.Lock()
	t.spent[s.label] += d
	t.mu.Unlock()
}

// statementLabel names a statement for the profile: the sqlc query name of
// txlimit's statements, the first words of the others.
func statementLabel(sql string) string {
	sql = strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(sql, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		return name
	}
	f := strings.Fields(sql)
	switch {
	case len(f) == 0:
		return "(empty)"
	case strings.Contains(sql, "floor_table"):
		return "floor " + strings.ToUpper(f[0])
	case strings.Contains(sql, "bench_orders"):
		return "business " + strings.ToUpper(f[0])
	case len(f) >= 3 && strings.EqualFold(f[1], "TO"):
		return strings.ToUpper(f[0] + " TO " + f[2]) // ROLLBACK TO SAVEPOINT
	}
	return strings.ToUpper(f[0])
}

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.queries.Add(1)
	if !t.timing {
		return ctx
	}
	return t.start(ctx, statementLabel(d.SQL))
}

func (t *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) { t.end(ctx) }

func (t *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	t.batches.Add(1)
	if !t.timing {
		return ctx
	}
	labels := make([]string, len(d.Batch.QueuedQueries))
	for i, q := range d.Batch.QueuedQueries {
		labels[i] = statementLabel(q.SQL)
	}
	return t.start(ctx, "["+strings.Join(labels, " + ")+"]")
}

func (t *tracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.HasPrefix(d.SQL, "ROLLBACK TO SAVEPOINT") {
		t.undos.Add(1)
	}
}

func (t *tracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) { t.end(ctx) }

// errDenied rolls back the transaction of a call that its limit denied, as
// an application does; take reports the denial, not an error.
var errDenied = errors.New("denied")

// pgStep is the limit step of one call inside the caller's transaction on
// PostgreSQL.
type pgStep func(ctx context.Context, tx pgx.Tx) (ok bool, err error)

// pgClient is a client of any PostgreSQL subject on a connection of its
// own: each call is BEGIN; the work (an order's INSERT, pgbench's tpcb-like
// statements, or none); the subject's limit step; COMMIT, or ROLLBACK when
// the step denied.
type pgClient struct {
	conn    *pgxpool.Conn
	work    *pgWork
	step    pgStep
	release func() // what else the client holds (a Redis connection)
}

func newPgClient(conn *pgxpool.Conn, key string, w work, step pgStep) *pgClient {
	return &pgClient{conn: conn, work: newPgWork(w, key), step: step}
}

func (c *pgClient) take(ctx context.Context) (r call, err error) {
	err = pgx.BeginFunc(ctx, c.conn, func(tx pgx.Tx) error {
		if err := c.work.do(ctx, tx); err != nil {
			return err
		}
		start := time.Now()
		ok, err := c.step(ctx, tx)
		r = call{ok: ok, step: time.Since(start)}
		if err == nil && !ok {
			return errDenied
		}
		return err
	})
	if errors.Is(err, errDenied) {
		err = nil
	}
	return r, err
}

func (c *pgClient) close() {
	if c.release != nil {
		c.release()
	}
	c.conn.Release()
}

// pgLimit is txlimit on PostgreSQL: LimitTx in the caller's pgx.Tx. store
// and tune make its variants: another store on the same pool, another mode
// or setting of the same limit.
type pgLimit struct {
	p     *pgPool
	store driver.Store[pgx.Tx]
	tune  func(*txlimit.Config)
}

func (s pgLimit) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	l, err := newLimiter(s.store, spec, s.tune)
	if err != nil {
		return nil, err
	}
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return newPgClient(conn, key, w, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		res, err := l.LimitTx(ctx, tx, spec.Name, key)
		return res.OK, err
	}), nil
}

func (s pgLimit) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	l, err := newLimiter(s.store, spec, s.tune)
	if err != nil {
		return 0, err
	}
	read, err := l.Check(ctx, spec.Name, key, txlimit.Count(0))
	return read.Remaining, err
}

// pgNone is the business transaction with no limit at all (BEGIN; the
// work; COMMIT): the ceiling of every limited one.
type pgNone struct{ p *pgPool }

func (s pgNone) newClient(ctx context.Context, _ limitSpec, key string, w work) (client, error) {
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return newPgClient(conn, key, w, func(context.Context, pgx.Tx) (bool, error) { return true, nil }), nil
}

func (pgNone) value(context.Context, limitSpec, string) (float64, error) {
	return 0, errors.New("the business transaction alone has no limit to read")
}

// pgFloor is the hand-written floor on PostgreSQL.
type pgFloor struct{ p *pgPool }

func (s pgFloor) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	conn, err := s.p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	k := floorKey(spec, key)
	if spec.Shards > 1 {
		if _, err := conn.Exec(ctx, pgShardFloorInsert, k, spec.Capacity/float64(spec.Shards), spec.now(), spec.Shards); err != nil {
			conn.Release()
			return nil, err
		}
		return newPgClient(conn, key, w, shardFloorStep(spec, k)), nil
	}
	if _, err := conn.Exec(ctx, benchfloor.PGInsert, k, spec.Capacity, spec.now()); err != nil {
		conn.Release()
		return nil, err
	}
	return newPgClient(conn, key, w, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		var value float64
		var ts time.Time
		if err := tx.QueryRow(ctx, benchfloor.PGSelect, k).Scan(&value, &ts); err != nil {
			return false, err
		}
		now := spec.now()
		left := spec.project(value, ts, now) - 1
		if left < 0 {
			return false, nil
		}
		_, err := tx.Exec(ctx, benchfloor.PGUpdate, k, left, now)
		return err == nil, err
	}), nil
}

// shardFloorStep is the floor of a sharded limit: one token from the one
// shard it locks, each shard a bucket of its own with 1/Shards of the rate
// and capacity. It does not pool shards (a call whose shard is short is
// denied), so it takes part only in the timed runs, where no shard runs
// out, and not in the saturating admission checks.
func shardFloorStep(spec limitSpec, k string) pgStep {
	shard := spec.shard()
	return func(ctx context.Context, tx pgx.Tx) (bool, error) {
		start := int32(mathrand.IntN(spec.Shards))
		var s int32
		var value float64
		var ts time.Time
		err := tx.QueryRow(ctx, pgShardFloorTry, k, start).Scan(&s, &value, &ts)
		if errors.Is(err, pgx.ErrNoRows) {
			err = tx.QueryRow(ctx, pgShardFloorWait, k, start).Scan(&s, &value, &ts)
		}
		if err != nil {
			return false, err
		}
		now := shard.now()
		left := shard.project(value, ts, now) - 1
		if left < 0 {
			return false, nil
		}
		_, err = tx.Exec(ctx, pgShardFloorUpdate, k, s, left, now)
		return err == nil, err
	}
}

func (s pgFloor) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	if spec.Shards > 1 {
		rows, err := s.p.pool.Query(ctx, `SELECT value, ts FROM floor_shards WHERE k = $1`, floorKey(spec, key))
		if err != nil {
			return 0, err
		}
		var value, sum float64
		var ts time.Time
		shard, now := spec.shard(), spec.now()
		_, err = pgx.ForEachRow(rows, []any{&value, &ts}, func() error {
			sum += shard.project(value, ts, now)
			return nil
		})
		return sum, err
	}
	var value float64
	var ts time.Time
	if err := s.p.pool.QueryRow(ctx, `SELECT value, ts FROM floor_table WHERE k = $1`, floorKey(spec, key)).Scan(&value, &ts); err != nil {
		return 0, err
	}
	return spec.project(value, ts, spec.now()), nil
}

// --- SQLite ---

// sqliteEnv is a WAL database file in a temporary directory.
type sqliteEnv struct {
	db      *sql.DB
	version string
}

// sqliteDSN is the configuration sqlitestore documents: wait for the write
// lock (busy_timeout), WAL, and BEGIN IMMEDIATE for every transaction.
const sqliteDSN = "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

func openSQLite(ctx context.Context) (env *sqliteEnv, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "txlimit-bench-")
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bench.db")+sqliteDSN)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	cleanup = func() {
		_ = db.Close()
		_ = os.RemoveAll(dir)
	}
	env = &sqliteEnv{db: db}
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&env.version); err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := migrations.Up(ctx, db, migrations.SQLite); err != nil {
		cleanup()
		return nil, nil, err
	}
	for _, ddl := range []string{benchfloor.SQLiteDDL, sqliteBusinessDDL} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("create the floor's and the business tables: %w", err)
		}
	}
	return env, cleanup, nil
}

// sqlStep is the limit step of one call inside the caller's *sql.Tx.
type sqlStep func(ctx context.Context, tx *sql.Tx) (ok bool, err error)

// sqlClient is a client of a database/sql subject on a connection of its
// own: BeginTx; with business, the INSERT of an order (businessSQL, in the
// dialect's placeholders); the step; Commit, or Rollback when it denied.
type sqlClient struct {
	conn        *sql.Conn
	businessSQL string
	business    string // the key the orders are inserted under; "" for none
	step        sqlStep
}

func (c *sqlClient) take(ctx context.Context) (call, error) {
	tx, err := c.conn.BeginTx(ctx, nil)
	if err != nil {
		return call{}, err
	}
	if c.business != "" {
		if _, err := tx.ExecContext(ctx, c.businessSQL, c.business, 1); err != nil {
			_ = tx.Rollback()
			return call{}, err
		}
	}
	start := time.Now()
	ok, err := c.step(ctx, tx)
	r := call{ok: ok, step: time.Since(start)}
	if err != nil || !ok {
		_ = tx.Rollback()
		return r, err
	}
	return r, tx.Commit()
}

func (c *sqlClient) close() { _ = c.conn.Close() }

func newSQLClient(conn *sql.Conn, businessSQL, key string, business bool, step sqlStep) *sqlClient {
	c := &sqlClient{conn: conn, businessSQL: businessSQL, step: step}
	if business {
		c.business = key
	}
	return c
}

// orderOnly is whether a database/sql subject's transactions insert an
// order: they run the business transaction's work or none, and refuse the
// tpcb-like work, which only the pgx subjects run.
func orderOnly(w work) (business bool, err error) {
	if w == tpcbWork {
		return false, errors.New("the database/sql subjects do not run the tpcb-like work")
	}
	return w == orderWork, nil
}

// sqlLimit is txlimit on database/sql: BeginTx, LimitTx, Commit. Its
// clients share one Store, as sqlitestore.New asks, so that the statements
// it prepares serve every client and every cell. businessSQL is the orders
// INSERT in the store's dialect.
type sqlLimit struct {
	db          *sql.DB
	store       driver.Store[*sql.Tx]
	businessSQL string
	tune        func(*txlimit.Config)
}

func (s sqlLimit) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	business, err := orderOnly(w)
	if err != nil {
		return nil, err
	}
	l, err := newLimiter(s.store, spec, s.tune)
	if err != nil {
		return nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return newSQLClient(conn, s.businessSQL, key, business, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		res, err := l.LimitTx(ctx, tx, spec.Name, key)
		return res.OK, err
	}), nil
}

func (s sqlLimit) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	l, err := newLimiter(s.store, spec, s.tune)
	if err != nil {
		return 0, err
	}
	read, err := l.Check(ctx, spec.Name, key, txlimit.Count(0))
	return read.Remaining, err
}

// sqliteFloor is the hand-written floor on SQLite: BEGIN IMMEDIATE (from the
// DSN's _txlock), SELECT, UPDATE, COMMIT.
type sqliteFloor struct{ db *sql.DB }

func (s sqliteFloor) newClient(ctx context.Context, spec limitSpec, key string, w work) (client, error) {
	business, err := orderOnly(w)
	if err != nil {
		return nil, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	k := floorKey(spec, key)
	if _, err := conn.ExecContext(ctx, benchfloor.SQLiteInsert, k, spec.Capacity, spec.now().UnixMicro()); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return newSQLClient(conn, sqliteBusinessInsert, key, business, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		var value float64
		var ts int64
		if err := tx.QueryRowContext(ctx, benchfloor.SQLiteSelect, k).Scan(&value, &ts); err != nil {
			return false, err
		}
		now := spec.now()
		left := spec.project(value, time.UnixMicro(ts), now) - 1
		if left < 0 {
			return false, nil
		}
		_, err := tx.ExecContext(ctx, benchfloor.SQLiteUpdate, left, now.UnixMicro(), k)
		return err == nil, err
	}), nil
}

func (s sqliteFloor) value(ctx context.Context, spec limitSpec, key string) (float64, error) {
	var value float64
	var ts int64
	if err := s.db.QueryRowContext(ctx, `SELECT value, ts FROM floor_table WHERE k = ?`, floorKey(spec, key)).Scan(&value, &ts); err != nil {
		return 0, err
	}
	return spec.project(value, time.UnixMicro(ts), spec.now()), nil
}
