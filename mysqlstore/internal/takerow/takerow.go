// Package takerow is mysqlstore's one-statement take: an admitted call on an
// unsharded limit as one INSERT … ON DUPLICATE KEY UPDATE that refills,
// decides and writes with algo's arithmetic in SQL, and the read of what it
// did. It is a package of its own so that the differential test in
// mysqlstore/mysqltest, which runs on a real server, can hold the statement
// itself, not only the store's whole Take, to algo.
package takerow

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlimit/txlimit/driver"
)

// SQL is one admitted call on an unsharded limit in one statement:
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
// @txlimit_value and @txlimit_ts (ReadSQL reads them, for a key found
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
var SQL = `-- name: TakeRow :execrows
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

// ReadSQL reads what SQL did, in the same transaction just
// after it: the row as the transaction now has it (its own write; a
// consistent read), the clock, whether it granted, the row's state before
// it, and the highest shard of the key as the snapshot has it (a consistent
// read, locking nothing): rows beyond shard 0, left by a sharded config, make
// the call one for the locked path, which pools them. It is bound by hand
// for the user variables, which sqlc cannot type.
const ReadSQL = `-- name: TakeRowRead :one
SELECT t.value, t.ts, CAST(@txlimit_now AS DATETIME(6)) AS clock, CAST(@txlimit_ok AS SIGNED) AS ok,
       CAST(@txlimit_value AS DOUBLE) AS old_value, CAST(@txlimit_ts AS DATETIME(6)) AS old_ts,
       CAST(COALESCE((SELECT MAX(m.shard) FROM txlimit AS m WHERE m.name = ? AND m.` + "`key`" + ` = ?), 0) AS SIGNED) AS top
FROM txlimit AS t
WHERE t.name = ? AND t.` + "`key`" + ` = ? AND t.shard = 0`

// The steps of algo.Take, each written once as SQL over a row's value v,
// its time t and e, the microseconds from t to the clock, with the
// parameters in c. SQL uses them for a missing row (the full state)
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

// Result is what SQL did and ReadSQL read back.
type Result struct {
	// Affected is SQL's affected-rows count: 1 when it created the row, 2
	// when it updated it, 0 when it proposed nothing or left the row as it
	// was (ReadSQL is not run then).
	Affected int64
	// Value and TS are the row as the transaction now has it, Clock the
	// clock of the call.
	Value     float64
	TS, Clock time.Time
	// Granted is the decision the statement made (@txlimit_ok).
	Granted bool
	// Prior is the row as it was, when the statement found one.
	Prior *driver.Row
	// Top is the highest shard of the key as the snapshot has it.
	Top int64
}

// Run runs SQL for p and, when it changed a row, ReadSQL, in tx. now is the
// call's clock, nil for the server's.
func Run(ctx context.Context, tx *sql.Tx, p driver.TakeParams, now *time.Time) (Result, error) {
	c := p.Config
	full := p.Full()
	var at any
	if now != nil {
		at = now.UTC()
	}
	name, key := []byte(p.Name), []byte(p.Key)
	r, err := tx.ExecContext(ctx, SQL, name, key, at, int64(c.Kind), c.Rate, c.Period, c.Capacity, c.MaxReserved,
		p.Count, p.Reserve, full.Value, time.UnixMicro(full.TS).UTC(), c.Capacity)
	if err != nil {
		return Result{}, err
	}
	var out Result
	if out.Affected, err = r.RowsAffected(); err != nil || out.Affected == 0 {
		return out, err
	}
	var (
		ok       int64
		oldValue sql.NullFloat64
		oldTS    sql.NullTime
	)
	err = tx.QueryRowContext(ctx, ReadSQL, name, key, name, key).Scan(&out.Value, &out.TS, &out.Clock, &ok, &oldValue, &oldTS, &out.Top)
	if errors.Is(err, sql.ErrNoRows) {
		return Result{}, errors.New("txlimit/mysqlstore: the row the one-statement take wrote is not there")
	}
	if err != nil {
		return Result{}, err
	}
	out.Granted = ok == 1
	if oldValue.Valid && oldTS.Valid {
		out.Prior = &driver.Row{Shard: 0, Value: oldValue.Float64, TS: oldTS.Time}
	}
	return out, nil
}
