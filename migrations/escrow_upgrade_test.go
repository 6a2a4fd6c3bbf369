package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/migrations"
)

// Migration 00008 settles the escrow calls still pending and drops escrow
// mode's tables. These tests make the pending calls by hand, statement for
// statement as pgstore's escrow code made them, so that they outlive that
// code: the claim in the caller's own transaction (EscrowClaim), then the
// debit and the pending entry in one autocommit statement on another
// connection, the store's (EscrowDebit), committed before the caller goes
// on. Every debit happens at the row's own instant, when a refill adds
// nothing, so the debit's arithmetic is value - count.

// lastEscrowVersion is the last migration with escrow's tables.
const lastEscrowVersion = 7

var (
	escrowAt = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	bucket   = algo.Config{Kind: algo.TokenBucket, Rate: 100, Period: time.Minute.Microseconds(), Capacity: 100}
	window   = algo.Config{Kind: algo.FixedWindow, Rate: 10, Period: time.Hour.Microseconds(), Capacity: 10}
)

// escrowDB is a fresh schema migrated to lastEscrowVersion.
type escrowDB struct {
	t       *testing.T
	schema  string
	db      *sql.DB       // what the application gives migrations.Up
	callers *pgxpool.Pool // the callers' transactions
	store   *pgxpool.Pool // the store's own connections (the debits) and the test's reads
}

// newEscrowDB makes one. params are settings for the migration's
// connections (default_transaction_isolation, lock_timeout).
func newEscrowDB(t *testing.T, params map[string]string) *escrowDB {
	t.Helper()
	schema := testdb.EmptySchema(t)
	// goose needs two connections: its lock row is renewed on one while
	// the migrations run on the other.
	db := stdlib.OpenDBFromPool(testdb.PoolParams(t, schema, pgx.QueryExecModeCacheStatement, 2, params))
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.Provider(db, migrations.Postgres)
	require.NoError(t, err)
	_, err = p.UpTo(context.Background(), lastEscrowVersion)
	require.NoError(t, err)
	return &escrowDB{
		t: t, schema: schema, db: db,
		callers: testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 8),
		store:   testdb.Pool(t, schema, pgx.QueryExecModeCacheStatement, 4),
	}
}

func (e *escrowDB) exec(sql string, args ...any) pgconn.CommandTag {
	e.t.Helper()
	tag, err := e.store.Exec(context.Background(), sql, args...)
	require.NoError(e.t, err, sql)
	return tag
}

// row writes a limit's row as the locked model does, stamped escrowAt.
func (e *escrowDB) row(name, key string, shard int32, value float64) {
	e.t.Helper()
	e.exec(`INSERT INTO txlimit (name, key, shard, value, ts) VALUES ($1, $2, $3, $4, $5)`, name, key, shard, value, escrowAt)
}

// begin opens a caller's transaction.
func (e *escrowDB) begin() pgx.Tx {
	e.t.Helper()
	tx, err := e.callers.Begin(context.Background())
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// claim inserts a call's claim in the caller's transaction and returns it
// with that transaction's top-level id, as EscrowClaim did.
func (e *escrowDB) claim(tx pgx.Tx) (id, xid int64) {
	e.t.Helper()
	require.NoError(e.t, tx.QueryRow(context.Background(),
		`INSERT INTO txlimit_escrow_claim DEFAULT VALUES RETURNING id, CAST(CAST(pg_current_xact_id() AS text) AS bigint)`).Scan(&id, &xid))
	return id, xid
}

// debit takes count from the row of (name, key) for the claim and records
// the pending entry, in one autocommit statement on the store's connection,
// as EscrowDebit did. ctx bounds it: the test of lock order needs it not to
// wait for the migration.
func (e *escrowDB) debit(ctx context.Context, id, xid int64, name, key string, count float64) {
	e.t.Helper()
	tag, err := e.store.Exec(ctx, `
WITH u AS (
    UPDATE txlimit SET value = value - $5
    WHERE name = $3 AND key = $4 AND shard = 0 AND value >= $5
    RETURNING shard
)
INSERT INTO txlimit_escrow (claim, xid, name, key, shard, count)
SELECT $1, $2, $3, $4, u.shard, $5 FROM u`, id, xid, name, key, count)
	require.NoError(e.t, err)
	require.EqualValues(e.t, 1, tag.RowsAffected(), "the debit of %v from %s/%s was granted", count, name, key)
}

// call makes an escrow call of count on (name, key) in tx.
func (e *escrowDB) call(tx pgx.Tx, name, key string, count float64) (claim int64) {
	e.t.Helper()
	id, xid := e.claim(tx)
	e.debit(context.Background(), id, xid, name, key, count)
	return id
}

func (e *escrowDB) commit(tx pgx.Tx) {
	e.t.Helper()
	require.NoError(e.t, tx.Commit(context.Background()))
}

func (e *escrowDB) rollback(tx pgx.Tx) {
	e.t.Helper()
	require.NoError(e.t, tx.Rollback(context.Background()))
}

// rows returns every limit row's value by "name/key/shard", and checks
// that each still has the time it was written with: settlement gives
// tokens back without moving a row's clock.
func (e *escrowDB) rows() map[string]float64 {
	e.t.Helper()
	rs, err := e.store.Query(context.Background(), `SELECT name, key, shard, value, ts FROM txlimit`)
	require.NoError(e.t, err)
	out := map[string]float64{}
	for rs.Next() {
		var name, key string
		var shard int32
		var value float64
		var ts time.Time
		require.NoError(e.t, rs.Scan(&name, &key, &shard, &value, &ts))
		require.True(e.t, ts.Equal(escrowAt), "%s/%s/%d ts %v", name, key, shard, ts)
		out[fmt.Sprintf("%s/%s/%d", name, key, shard)] = value
	}
	require.NoError(e.t, rs.Err())
	return out
}

// value returns the value of (name, key)'s shard 0.
func (e *escrowDB) value(name, key string) float64 {
	e.t.Helper()
	v, ok := e.rows()[name+"/"+key+"/0"]
	require.True(e.t, ok, "%s/%s has a row", name, key)
	return v
}

// escrowTables reports which of escrow's tables exist.
func (e *escrowDB) escrowTables() []string {
	e.t.Helper()
	var out []string
	for _, table := range []string{"txlimit_escrow", "txlimit_escrow_claim"} {
		var found bool
		require.NoError(e.t, e.store.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, e.schema+"."+table).Scan(&found))
		if found {
			out = append(out, table)
		}
	}
	return out
}

func (e *escrowDB) version() int64 {
	e.t.Helper()
	p, err := migrations.Provider(e.db, migrations.Postgres)
	require.NoError(e.t, err)
	v, err := p.GetDBVersion(context.Background())
	require.NoError(e.t, err)
	return v
}

// latest is the version of the last migration, which Up reaches.
func (e *escrowDB) latest() int64 {
	e.t.Helper()
	p, err := migrations.Provider(e.db, migrations.Postgres)
	require.NoError(e.t, err)
	sources := p.ListSources()
	return sources[len(sources)-1].Version
}

// up runs migrations.Up in a goroutine, as an application starting with
// the new version would.
func (e *escrowDB) up() <-chan error {
	done := make(chan error, 1)
	go func() { done <- migrations.Up(context.Background(), e.db, migrations.Postgres) }()
	return done
}

// waitForMigrationToWait returns once a statement waits for a lock on
// escrow's tables or the claims' id sequence: the migration, behind an open
// caller.
func (e *escrowDB) waitForMigrationToWait(done <-chan error) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		require.NoError(e.t, e.store.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE NOT granted AND relation IN (to_regclass($1 || '.txlimit_escrow_claim'),
			   to_regclass($1 || '.txlimit_escrow_claim_id_seq'), to_regclass($1 || '.txlimit_escrow'))`, e.schema).Scan(&waiting))
		if waiting > 0 {
			return
		}
		select {
		case err := <-done:
			e.t.Fatalf("migrations.Up returned (%v) while a caller's transaction with an escrow call was open", err)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the migration never waited for the open caller")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// await returns what migrations.Up returned.
func (e *escrowDB) await(done <-chan error) error {
	e.t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		e.t.Fatal("migrations.Up did not return")
		return nil
	}
}

// The upgrade with calls pending, every way a call could end: each limit
// holds its value before the calls minus the tokens of the callers that
// committed, no more and no less, the escrow tables are gone, and a second
// Up changes nothing.
func TestEscrowUpgradeSettlesPendingCalls(t *testing.T) {
	ctx := context.Background()
	e := newEscrowDB(t, nil)
	for _, key := range []string{"acme", "globex", "initech", "hooli"} {
		e.row("orders", key, 0, 100)
	}
	e.row("quota", "acme", 0, 10)
	// A sharded limit of the locked model on the same key: no escrow
	// call is its, and settlement must not touch it.
	e.row("api", "acme", 0, 5)
	e.row("api", "acme", 1, 5)

	// orders/acme: 3 and 2 committed, 5 + 4 + 1 + 6 not.
	tx := e.begin()
	e.call(tx, "orders", "acme", 3)
	e.commit(tx)
	tx = e.begin()
	e.call(tx, "orders", "acme", 5)
	e.rollback(tx)
	tx = e.begin()
	e.call(tx, "orders", "acme", 2)
	_, err := tx.Exec(ctx, "SAVEPOINT call")
	require.NoError(t, err)
	e.call(tx, "orders", "acme", 4)
	_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT call")
	require.NoError(t, err)
	e.commit(tx) // 2 spent, 4 rolled back to the savepoint
	tx = e.begin()
	claim := e.call(tx, "orders", "acme", 1)
	// LimitAll cancelled a granted escrow call when another limit denied:
	// it deleted the claim in the caller's transaction (EscrowUnclaim).
	_, err = tx.Exec(ctx, "DELETE FROM txlimit_escrow_claim WHERE id = $1", claim)
	require.NoError(t, err)
	e.commit(tx)
	// A caller whose backend dies in the middle of its transaction.
	conn, err := e.callers.Acquire(ctx)
	require.NoError(t, err)
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	e.call(tx, "orders", "acme", 6)
	var ended bool
	require.NoError(t, e.store.QueryRow(ctx, "SELECT pg_terminate_backend($1, 10000)", conn.Conn().PgConn().PID()).Scan(&ended))
	require.True(t, ended, "the caller's backend ended")
	conn.Release() // in a transaction: the pool closes it

	// orders/globex: 10 rolled back, and the application credited 10
	// meanwhile, capped at the capacity (CreditTx). Settlement adds the 10
	// to the row as stored, as Settle did: it reads capped.
	tx = e.begin()
	e.call(tx, "orders", "globex", 10)
	e.rollback(tx)
	e.exec(`UPDATE txlimit SET value = least(value + 10, 100) WHERE name = 'orders' AND key = 'globex'`)

	// orders/initech: 2 committed, 3 rolled back, then the row pruned as
	// full. A missing row is a full limit: nothing to give back.
	tx = e.begin()
	e.call(tx, "orders", "initech", 2)
	e.commit(tx)
	tx = e.begin()
	e.call(tx, "orders", "initech", 3)
	e.rollback(tx)
	e.exec(`DELETE FROM txlimit WHERE name = 'orders' AND key = 'initech'`)

	// orders/hooli: a committed call of 1, and a call of 7 whose caller is
	// open when the limit is reset (ResetTx of an escrow limit: the row
	// goes and the key's pending entries are detached, EscrowDeleteKey);
	// then the locked model takes 4 from the fresh limit, and the caller
	// rolls back. Its tokens were taken before the reset: the fresh limit
	// gets nothing. The committed call's claim is left without an entry.
	tx = e.begin()
	e.call(tx, "orders", "hooli", 1)
	e.commit(tx)
	open := e.begin()
	e.call(open, "orders", "hooli", 7)
	reset := e.begin()
	_, err = reset.Exec(ctx, `DELETE FROM txlimit WHERE name = 'orders' AND key = 'hooli'`)
	require.NoError(t, err)
	_, err = reset.Exec(ctx, `DELETE FROM txlimit_escrow WHERE name = 'orders' AND key = 'hooli'`)
	require.NoError(t, err)
	e.commit(reset)
	e.row("orders", "hooli", 0, 100-4)
	e.rollback(open)

	// quota/acme, a fixed window: 4 committed, 6 rolled back.
	tx = e.begin()
	e.call(tx, "quota", "acme", 4)
	e.commit(tx)
	tx = e.begin()
	e.call(tx, "quota", "acme", 6)
	e.rollback(tx)

	// A claim whose debit failed, in a transaction that committed anyway.
	tx = e.begin()
	e.claim(tx)
	e.commit(tx)

	var entries, claims int
	require.NoError(t, e.store.QueryRow(ctx, `SELECT (SELECT count(*) FROM txlimit_escrow), (SELECT count(*) FROM txlimit_escrow_claim)`).Scan(&entries, &claims))
	require.Equal(t, 11, entries, "the calls pending at the upgrade (hooli's were detached by the reset)")
	require.Equal(t, 6, claims, "the committed calls' claims, acme's 3 and 2, initech's 2, hooli's 1, quota's 4, and the one without a debit")

	require.NoError(t, migrations.Up(ctx, e.db, migrations.Postgres))

	for _, w := range []struct {
		row      string
		cfg      algo.Config
		before   float64 // the value before the calls
		spent    float64 // the committed callers' tokens
		credited float64 // what the application gave back meanwhile
		stored   float64 // what settlement writes: the debited value plus the refunds, not capped
	}{
		{"orders/acme/0", bucket, 100, 3 + 2, 0, 100 - (3 + 5 + 2 + 4 + 1 + 6) + (5 + 4 + 1 + 6)},
		{"orders/globex/0", bucket, 100, 0, 10, 100 + 10}, // debited to 90, credited to 100, refunded
		{"orders/hooli/0", bucket, 100, 4, 0, 100 - 4},    // the row since the reset
		{"quota/acme/0", window, 10, 4, 0, 10 - 4},
		{"api/acme/0", bucket, 5, 0, 0, 5},
		{"api/acme/1", bucket, 5, 0, 0, 5},
	} {
		got, ok := e.rows()[w.row]
		require.True(t, ok, "%s has a row", w.row)
		require.Equal(t, w.stored, got, w.row)
		read := algo.Project(w.cfg, algo.State{Value: got, TS: escrowAt.UnixMicro()}, escrowAt.UnixMicro()).Value
		require.Equal(t, math.Min(w.before-w.spent+w.credited, w.cfg.Capacity), read, "%s as every reader projects it", w.row)
	}
	require.Len(t, e.rows(), 6, "no row for orders/initech: a refund to a missing row is dropped")
	require.Empty(t, e.escrowTables())
	require.EqualValues(t, e.latest(), e.version())

	before := e.rows()
	p, err := migrations.Provider(e.db, migrations.Postgres)
	require.NoError(t, err)
	res, err := p.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, res, "a second Up applies nothing")
	require.Equal(t, before, e.rows(), "a second Up changes no limit")
}

// A caller whose transaction is open when the migration starts is waited
// for, then settled on how it ended, at every isolation level the
// migration may run at: its locks come before its first snapshot.
func TestEscrowUpgradeWaitsForOpenCaller(t *testing.T) {
	for _, isolation := range []string{"read committed", "repeatable read", "serializable"} {
		for _, commits := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/commits=%v", isolation, commits), func(t *testing.T) {
				e := newEscrowDB(t, map[string]string{"default_transaction_isolation": isolation})
				e.row("orders", "acme", 0, 100)
				e.row("orders", "globex", 0, 100)
				tx := e.begin()
				e.call(tx, "orders", "acme", 3)
				// Another caller that ended before: settled in the same run.
				done := e.begin()
				e.call(done, "orders", "globex", 5)
				e.rollback(done)

				up := e.up()
				e.waitForMigrationToWait(up)
				// A caller in this state of a real upgrade writes on to the
				// end of its transaction: the limit's row too (a locked take).
				_, err := tx.Exec(context.Background(), `UPDATE txlimit SET value = value - 1 WHERE name = 'orders' AND key = 'acme'`)
				require.NoError(t, err)
				if commits {
					e.commit(tx)
				} else {
					e.rollback(tx)
				}
				require.NoError(t, e.await(up))

				want := 100.0
				if commits {
					want = 100 - 3 - 1
				}
				require.Equal(t, want, e.value("orders", "acme"))
				require.Equal(t, 100.0, e.value("orders", "globex"))
				require.Empty(t, e.escrowTables())
			})
		}
	}
}

// A caller in flight when the migration starts: claimed, its debit not
// sent yet. Its debit is not held up by the migration (which waits for the
// caller, and the caller for its debit, a wait PostgreSQL cannot see), and
// the debit, made while the migration waits, is settled with the rest.
func TestEscrowUpgradeLetsDebitInFlightFinish(t *testing.T) {
	e := newEscrowDB(t, nil)
	e.row("orders", "acme", 0, 100)
	tx := e.begin()
	id, xid := e.claim(tx)
	up := e.up()
	e.waitForMigrationToWait(up)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.debit(ctx, id, xid, "orders", "acme", 8)
	require.Equal(t, 92.0, e.value("orders", "acme"))
	e.rollback(tx)
	require.NoError(t, e.await(up))
	require.Equal(t, 100.0, e.value("orders", "acme"), "the rolled-back caller's debit came back")
	require.Empty(t, e.escrowTables())
}

// A caller still open whose call was rolled back to a savepoint: its claim
// is dead, but its transaction still holds the lock on the claims' id
// sequence (a sequence's lock belongs to the top-level transaction), so the
// migration waits for it, before it locks any limit's row, and then gives
// the tokens back even though the caller commits.
func TestEscrowUpgradeWaitsForSavepointRolledBackCaller(t *testing.T) {
	e := newEscrowDB(t, nil)
	e.row("orders", "acme", 0, 100)
	tx := e.begin()
	ctx := context.Background()
	_, err := tx.Exec(ctx, "SAVEPOINT call")
	require.NoError(t, err)
	e.call(tx, "orders", "acme", 4)
	_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT call")
	require.NoError(t, err)

	up := e.up()
	e.waitForMigrationToWait(up)
	// The limit's row is free while the migration waits: a take of the
	// locked model goes through.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = e.store.Exec(tctx, `UPDATE txlimit SET value = value - 1 WHERE name = 'orders' AND key = 'acme'`)
	require.NoError(t, err, "a take while the migration waits")
	e.commit(tx)
	require.NoError(t, e.await(up))
	require.Equal(t, 100.0-1, e.value("orders", "acme"), "the call rolled back to the savepoint gave its 4 back")
	require.Empty(t, e.escrowTables())
}

// With a lock_timeout, an open caller makes the migration fail with the
// lock timeout instead of waiting, having changed nothing; once the caller
// has ended, the same Up succeeds and settles it.
func TestEscrowUpgradeLockTimeoutChangesNothing(t *testing.T) {
	e := newEscrowDB(t, map[string]string{"lock_timeout": "300ms"})
	e.row("orders", "acme", 0, 100)
	e.row("orders", "globex", 0, 100)
	tx := e.begin()
	e.call(tx, "orders", "acme", 3)
	ended := e.begin()
	e.call(ended, "orders", "globex", 5)
	e.rollback(ended)

	err := e.await(e.up())
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "a PostgreSQL error: %v", err)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available: %v", err)
	require.ErrorContains(t, err, "version:8", "the error names the migration")
	require.EqualValues(t, lastEscrowVersion, e.version())
	require.ElementsMatch(t, []string{"txlimit_escrow", "txlimit_escrow_claim"}, e.escrowTables())
	require.Equal(t, 97.0, e.value("orders", "acme"))
	require.Equal(t, 95.0, e.value("orders", "globex"), "nothing was settled")

	e.commit(tx)
	require.NoError(t, e.await(e.up()))
	require.Equal(t, 97.0, e.value("orders", "acme"))
	require.Equal(t, 100.0, e.value("orders", "globex"))
	require.Empty(t, e.escrowTables())
}

// Down re-creates escrow's tables as 00007 left them, so that the schema
// migrates down past 00007 and 00002 and up again.
func TestEscrowDropDown(t *testing.T) {
	ctx := context.Background()
	at7 := newEscrowDB(t, nil)
	down := newEscrowDB(t, nil)
	require.NoError(t, migrations.Up(ctx, down.db, migrations.Postgres))
	p, err := migrations.Provider(down.db, migrations.Postgres)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, lastEscrowVersion)
	require.NoError(t, err)
	want := at7.describeEscrow()
	require.NotEmpty(t, want)
	require.Equal(t, want, down.describeEscrow())

	_, err = p.DownTo(ctx, 1) // 00007's Down adds the shard check back, 00002's drops the tables
	require.NoError(t, err)
	require.Empty(t, down.escrowTables())
	require.NoError(t, migrations.Up(ctx, down.db, migrations.Postgres))
	require.Empty(t, down.escrowTables())
	require.EqualValues(t, down.latest(), down.version())
}

// describeEscrow lists the columns, constraints and indexes of escrow's
// tables, without the schema's name.
func (e *escrowDB) describeEscrow() []string {
	e.t.Helper()
	rs, err := e.store.Query(context.Background(), `
WITH rels AS (
  SELECT c.oid, c.relname FROM pg_class c
  WHERE c.relnamespace = $1::regnamespace AND c.relname IN ('txlimit_escrow', 'txlimit_escrow_claim'))
SELECT format('col %s.%s %s notnull=%s default=%s identity=%s', r.relname, a.attname,
  format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity)
FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = r.oid AND d.adnum = a.attnum
UNION ALL
SELECT format('con %s.%s %s', r.relname, c.conname, pg_get_constraintdef(c.oid))
FROM rels r JOIN pg_constraint c ON c.conrelid = r.oid
UNION ALL
SELECT format('idx %s', pg_get_indexdef(i.indexrelid))
FROM rels r JOIN pg_index i ON i.indrelid = r.oid
ORDER BY 1`, e.schema)
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rs, pgx.RowTo[string])
	require.NoError(e.t, err)
	for i := range out {
		out[i] = strings.ReplaceAll(out[i], e.schema+".", "")
	}
	return out
}
