package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
)

// takeRowSQL is one admitted call on an unsharded limit in one statement:
// it creates the row or locks it (waiting for the transaction that holds
// it), refills it to the clock, decides and writes, as algo.Take does. It
// writes nothing when the call is not granted or when the stored value is
// not finite; the store's locked path, which decides with algo in Go, then
// takes over (a denial costs it one more round trip).
//
// Why an INSERT: under REPEATABLE READ, InnoDB locks the gap where a row it
// looks for is missing, and gap locks do not conflict with each other but do
// block inserts; two transactions that both looked for new keys in the same
// gap and then both insert wait for each other (the deadlock Bucket4j and
// gravitee met on the first use of new keys). INSERT … ON DUPLICATE KEY
// UPDATE takes no gap lock: it creates a missing row (locked by its
// creation) or locks the one it finds by its primary key.
//
// A missing row is full (full_value at full_ts, algo.Full). The SELECT
// proposes that row, taken from, only when the call fits a full bucket: a
// call that does not fit a full bucket fits no row, and with nothing
// proposed there is no conflict, so the ON DUPLICATE KEY branch is not
// evaluated. On a conflict that branch refills the locked row (its latest
// version, not the transaction's snapshot) and decides. MySQL assigns
// ON DUPLICATE KEY UPDATE's columns from left to right, each seeing the
// ones before it already assigned, so the decision is made once, in the
// first assignment, and carried to the second in the user variable
// @txlimit_ok; the same assignment keeps the row's old state in
// @txlimit_value and @txlimit_ts (takeRowReadSQL reads them, for a key found
// to have other shards), and the clock is kept in @txlimit_now. These are
// session variables of the connection that runs the caller's transaction,
// set by every call before it reads them. (MySQL 8.0.13 deprecated setting
// user variables inside other statements, with a warning; MariaDB has not.)
//
// The arithmetic is algo's, operation for operation, on DOUBLE (IEEE
// doubles) and BIGINT microseconds (TIMESTAMPDIFF and TIMESTAMPADD are exact
// on DATETIME(6)), so that the state written is bit for bit the one algo
// computes; TestTakeRowMatchesAlgo (mysqltest) holds it to algo. Every
// parameter goes through CAST once, in c: with interpolateParams the driver
// writes a float64 such as 0.5 as a literal that MySQL reads as DECIMAL, and
// DECIMAL arithmetic is not IEEE arithmetic. kind is algo.Kind (1 token
// bucket, 2 fixed window); tol is algo's tolerance. A reservation is granted
// here only when its wait is surely below 2e15 µs (63 years, a bound from
// above); a longer one is left to the Go path, which refuses waits a
// Decision cannot hold.
//
// The clock is UTC_TIMESTAMP(6) unless the call brings its own: the server's
// time in UTC whatever the session's time_zone, read (like NOW(6)) when the
// statement starts. See "Clock" in the package documentation for why that
// and not SYSDATE(6).
//
// sqlc's MySQL engine does not compile it: it leaves sqlc.arg() inside a
// user variable assignment unreplaced, and knows UTC_TIMESTAMP only without
// its precision. Its first line names it as sqlc names the others.
var takeRowSQL = `-- name: TakeRow :execrows
INSERT INTO txlimit (name, ` + "`key`" + `, shard, value, ts)
SELECT c.name, c.k, 0, ` + newValue("c.full_value", "c.full_e") + `, ` + newTS("c.full_ts", "c.full_e") + `
FROM (
    SELECT b.*, TIMESTAMPDIFF(MICROSECOND, b.full_ts, b.now) AS full_e
    FROM (
        SELECT CAST(? AS BINARY) AS name, CAST(? AS BINARY) AS k,
               @txlimit_now := CAST(COALESCE(?, UTC_TIMESTAMP(6)) AS DATETIME(6)) AS now,
               CAST(? AS SIGNED) AS kind, CAST(? AS DOUBLE) AS rate, CAST(? AS SIGNED) AS period,
               CAST(? AS DOUBLE) AS capacity, CAST(? AS DOUBLE) AS max_reserved,
               CAST(? AS DOUBLE) AS count, CAST(? AS SIGNED) AS reserve,
               CAST(? AS DOUBLE) AS full_value, CAST(? AS DATETIME(6)) AS full_ts,
               1e-9 * GREATEST(1e0, CAST(? AS DOUBLE)) AS tol,
               @txlimit_ok := 1 AS ok, @txlimit_value := NULL AS old_value, @txlimit_ts := NULL AS old_ts
    ) AS b
) AS c
WHERE ` + fits("c.full_value", "c.full_e") + `
ON DUPLICATE KEY UPDATE
    value = IF((@txlimit_value := value) IS NULL OR (@txlimit_ts := ts) IS NULL
               OR NOT (@txlimit_ok := ` + fits("value", rowElapsed) + `),
               value, ` + newValue("value", rowElapsed) + `),
    ts = IF(@txlimit_ok, ` + newTS("ts", rowElapsed) + `, ts)`

// takeRowReadSQL reads what takeRowSQL did, in the same transaction just
// after it: the row as the transaction now has it (its own write; a
// consistent read), the clock, whether it granted, the row's state before
// it, and the highest shard of the key as the snapshot has it (a consistent
// read, locking nothing): rows beyond shard 0, left by a sharded config, make
// the call one for the locked path, which pools them. It is bound by hand
// for the user variables, which sqlc cannot type.
const takeRowReadSQL = `-- name: TakeRowRead :one
SELECT t.value, t.ts, CAST(@txlimit_now AS DATETIME(6)) AS clock, CAST(@txlimit_ok AS SIGNED) AS ok,
       CAST(@txlimit_value AS DOUBLE) AS old_value, CAST(@txlimit_ts AS DATETIME(6)) AS old_ts,
       CAST(COALESCE((SELECT MAX(m.shard) FROM txlimit AS m WHERE m.name = ? AND m.` + "`key`" + ` = ?), 0) AS SIGNED) AS top
FROM txlimit AS t
WHERE t.name = ? AND t.` + "`key`" + ` = ? AND t.shard = 0`

// The steps of algo.Take, each written once as SQL over a row's value v,
// its time t and e, the microseconds from t to the clock, with the
// parameters in c. takeRowSQL uses them for a missing row (the full state)
// and for the row it found.

// rowElapsed is e for the row ON DUPLICATE KEY UPDATE found.
const rowElapsed = "TIMESTAMPDIFF(MICROSECOND, ts, c.now)"

// projected is algo.Project's value: nothing added for e <= 0 or within a
// window, the value capped at Capacity.
func projected(v, e string) string {
	return "(CASE WHEN " + e + " <= 0 OR (c.kind = 2 AND " + e + " < c.period) THEN LEAST(" + v + ", c.capacity)" +
		" WHEN c.kind = 2 THEN LEAST(" + v + " + c.rate * CAST(" + e + " DIV c.period AS DOUBLE), c.capacity)" +
		" ELSE LEAST(" + v + " + CAST(" + e + " AS DOUBLE) * c.rate / CAST(c.period AS DOUBLE), c.capacity) END)"
}

// left is what the count leaves.
func left(v, e string) string { return "(" + projected(v, e) + " - c.count)" }

// newValue is algo.TakeShards's value on one shard: what is left, floored
// at 0 within the tolerance.
func newValue(v, e string) string {
	l := left(v, e)
	return "(CASE WHEN " + l + " >= -c.tol THEN CASE WHEN " + l + " > 0 THEN " + l + " ELSE 0e0 END ELSE " + l + " END)"
}

// newTS is algo.Project's time: the clock, or for a fixed window the start
// of the current window, unless nothing was added.
func newTS(t, e string) string {
	return "(CASE WHEN " + e + " <= 0 OR (c.kind = 2 AND " + e + " < c.period) THEN " + t +
		" WHEN c.kind = 2 THEN TIMESTAMPADD(MICROSECOND, -(" + e + " MOD c.period), c.now)" +
		" ELSE c.now END)"
}

// fits is the grant: a finite stored value, and the count fits or is a
// reservation within MaxReserved whose wait is surely representable.
func fits(v, e string) string {
	l := left(v, e)
	return "(" + v + " BETWEEN -1e300 AND 1e300 AND (" + l + " >= -c.tol" +
		" OR (c.reserve = 1 AND (c.max_reserved = 0 OR " + projected(v, e) + " - (c.count - c.max_reserved) >= -c.tol)" +
		" AND (-" + l + " / c.rate + 2) * CAST(c.period AS DOUBLE) + CAST(GREATEST(-(" + e + "), 0) AS DOUBLE) < 2e15)))"
}

// takeRow takes from an unsharded limit in one statement (takeRowSQL) and
// reads back what it did (takeRowReadSQL). done is false when it granted
// nothing: the caller then takes the locked path. When the key turns out to
// have rows beyond shard 0, prior holds the state row 0 had before the
// statement wrote it, for the locked path to pool instead of the written
// one.
func takeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (res driver.TakeResult, done bool, prior *driver.Row, err error) {
	c := p.Config
	full := p.Full()
	var now any
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.TakeResult{}, false, nil, err
		}
		now = p.Now.UTC()
	}
	name, key := []byte(p.Name), []byte(p.Key)
	r, err := tx.ExecContext(ctx, takeRowSQL, name, key, now, int64(c.Kind), c.Rate, c.Period, c.Capacity, c.MaxReserved,
		p.Count, p.Reserve, full.Value, time.UnixMicro(full.TS).UTC(), c.Capacity)
	if err != nil {
		return driver.TakeResult{}, false, nil, wrap(ctx, tx, "take", err)
	}
	// 1: the row was created, 2: updated. 0: nothing was proposed or the row
	// was left as it was (not granted, or a grant that changed nothing,
	// which the locked path grants again to the same effect). With
	// clientFoundRows=true a row left as it was counts 1; the read below
	// tells.
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return driver.TakeResult{}, false, nil, wrap(ctx, tx, "take", err)
	}
	var (
		next     algo.State
		ts, at   time.Time
		ok, top  int64
		oldValue sql.NullFloat64
		oldTS    sql.NullTime
	)
	err = tx.QueryRowContext(ctx, takeRowReadSQL, name, key, name, key).Scan(&next.Value, &ts, &at, &ok, &oldValue, &oldTS, &top)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return driver.TakeResult{}, false, nil, nil
	case err != nil:
		return driver.TakeResult{}, false, nil, wrap(ctx, tx, "take", err)
	}
	if err := checkUTC(ts, at); err != nil {
		return driver.TakeResult{}, false, nil, err
	}
	if ok != 1 {
		return driver.TakeResult{}, false, nil, nil
	}
	if top > 0 {
		if oldValue.Valid && oldTS.Valid {
			prior = &driver.Row{Shard: 0, Value: oldValue.Float64, TS: oldTS.Time}
		}
		return driver.TakeResult{}, false, prior, nil
	}
	next.TS = ts.UnixMicro()
	return driver.TakeResult{Decision: driver.Granted(c, next, at.UnixMicro()), At: at, States: []algo.State{next}}, true, nil, nil
}
