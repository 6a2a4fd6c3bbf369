// Package takerow is mysqlstore's one-statement take: an admitted call on an
// unsharded limit as one INSERT … ON DUPLICATE KEY UPDATE that refills,
// decides and writes with algo's arithmetic in SQL, and what it did, read
// with RETURNING on MariaDB and by a second statement on MySQL. It is a package of its own so that the differential test in
// mysqlstore's tests, which runs on a real server, can hold the statement
// itself, not only the store's whole Take, to algo.
package takerow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
)

// header starts the statement compile writes: one admitted call on an
// unsharded limit in one statement. It creates the row or locks it (waiting for the transaction that holds it),
// refills it to the clock, decides and writes, as algo.Take does, and
// writes nothing when the call is not granted or the stored value is not
// finite; the store's locked path, which decides with algo in Go, then
// takes over (a denial costs it a round trip more).
//
// Why an INSERT: under REPEATABLE READ, InnoDB locks the gap where a row it
// looks for is missing, and gap locks do not conflict with each other but do
// block inserts; two transactions that both looked for new keys in the same
// gap and then both insert wait for each other (the deadlock Bucket4j and
// gravitee met on the first use of new keys). INSERT … ON DUPLICATE KEY
// UPDATE takes no gap lock: it creates a missing row (locked by its
// creation) or locks the one it finds by its primary key.
//
// A missing row is full (algo.Full), and a call on it leaves Capacity -
// Count whatever the clock: Run computes that value in Go and proposes the
// row only when the call fits a full bucket without a reservation (a call
// that does not fit a full bucket fits no row; a reservation on a new key
// takes the locked path). The ON DUPLICATE KEY UPDATE branch refills the
// row it locked (its latest version, not the transaction's snapshot) and
// decides. MySQL assigns its columns from left to right, each seeing the
// ones before it already assigned, so the decision is made once, in the
// first assignment (its steps kept in user variables, see compile), and
// carried to the second in the user variable @txlimit_ok; the new row's
// time expression sets @txlimit_ok for a row it creates, and on MySQL the
// clock (@txlimit_now), which MariaDB returns instead. They are session
// variables of the connection that runs the caller's transaction, set by
// every call before it reads them. (MySQL 8.0.13 deprecated setting user
// variables inside other statements, with a warning; MariaDB has not.)
//
// The arithmetic is algo's, operation for operation, on DOUBLE (IEEE
// doubles) and BIGINT microseconds (TIMESTAMPDIFF and TIMESTAMPADD are exact
// on DATETIME(6)), so that the state written is bit for bit the one algo
// computes; TestTakeRowMatchesAlgo (mysqlstore) holds it to algo. No
// float64 reaches the server as a DECIMAL (with interpolateParams the driver
// writes 0.5 as a literal that MySQL reads as DECIMAL, and an expression of
// DECIMALs alone is not IEEE arithmetic): each is written as CAST(:x AS
// DOUBLE) here and Build writes it into the text as a DOUBLE literal in
// exponent form (5e-01), which the server reads with one correctly rounded
// conversion, as it does the CAST, but parses and evaluates as one token
// (see asDouble). Names and keys stay bound. A reservation is granted here
// only when its wait is surely below 2e15 µs (63 years, a bound from
// above); a longer one is left to the Go path, which refuses waits a
// Decision cannot hold.
//
// The statement is specialized by the limit's kind (algo.Project's two
// branches: projected and newTS below) and by the clock: :now is
// UTC_TIMESTAMP(6), the server's time in UTC whatever the session's
// time_zone, read (like NOW(6)) when the statement starts, or the call's
// own; and by whether the call reserves (see compile). See "Clock" in
// mysqlstore's package documentation for why that and not SYSDATE(6). The
// statement is one INSERT … VALUES: INSERT … SELECT from a derived table
// would cost the server a temporary table per call.
//
// sqlc's MySQL engine does not compile it: it leaves sqlc.arg() inside a
// user variable assignment unreplaced, and knows UTC_TIMESTAMP only without
// its precision. Its first line names it as sqlc names the others.
const header = "-- name: TakeRow :execrows\n"

// projected is algo.Project's value of the row found, for kind, from the
// microseconds e from its ts to the clock. e is a BIGINT: a product with a
// DOUBLE converts it to a double first (exactly, below 2^53 µs), as a CAST
// would, in fewer tokens.
func projected(kind algo.Kind, e string) string {
	if kind == algo.FixedWindow {
		// Whole windows of the period refill Rate each; within one nothing
		// is added; the value is capped at Capacity.
		return "IF(" + e + " < :period, LEAST(value, CAST(:capacity AS DOUBLE))," +
			" LEAST(value + CAST(:rate AS DOUBLE) * (" + e + " DIV :period), CAST(:capacity AS DOUBLE)))"
	}
	// The elapsed microseconds times Rate per Period, nothing for a clock at
	// or behind ts, capped at Capacity.
	return "IF(" + e + " <= 0, LEAST(value, CAST(:capacity AS DOUBLE))," +
		" LEAST(value + " + e + " * CAST(:rate AS DOUBLE) / CAST(:period_f AS DOUBLE), CAST(:capacity AS DOUBLE)))"
}

// newTS is algo.Project's time for a row at t, e microseconds before the
// clock: unchanged when nothing was added, else the clock (a token bucket)
// or the current window's start (a fixed window).
func newTS(kind algo.Kind, t, e string) string {
	if kind == algo.FixedWindow {
		return "IF(" + e + " < :period, " + t + ", TIMESTAMPADD(MICROSECOND, -(" + e + " MOD :period), :now))"
	}
	return "IF(" + e + " <= 0, " + t + ", :now)"
}

// advancedTS is the time the ON DUPLICATE KEY UPDATE branch writes: newTS
// of the row's ts for a grant (@txlimit_ok), ts otherwise, with the two
// conditions in one IF.
func advancedTS(kind algo.Kind, e string) string {
	if kind == algo.FixedWindow {
		return "IF(@txlimit_ok AND " + e + " >= :period, TIMESTAMPADD(MICROSECOND, -(" + e + " MOD :period), :now), ts)"
	}
	return "IF(@txlimit_ok AND " + e + " > 0, :now, ts)"
}

// compile writes out the statement for kind, with :now the server's clock
// or the call's, for a reservation or a plain take. Each step of the ON
// DUPLICATE KEY UPDATE branch is computed once, in the first assignment's
// condition, and kept in a user variable for the steps after it (MySQL
// evaluates an OR from left to right and stops at the first true operand):
// @txlimit_e the elapsed microseconds, @txlimit_p the refilled value,
// @txlimit_l what the count leaves of it.
//
// A plain take (reserve false, nearly every call) leaves out what only a
// reservation reads. The server parses every statement it is sent (with
// interpolateParams it is text), and its cost grows with the statement:
// with perf at 8 clients on 2 vCPUs (MariaDB 10.11), parsing this one
// (MYSQLparse and the lexer) was about a tenth of the server's time per
// call, against 3% for the floor's SELECT … FOR UPDATE and UPDATE. The two
// forms decide alike for a plain take: the reservation's clause is false
// there, and the new value's negative branch is never reached (the grant
// needs @txlimit_l >= -tol).
//
// The statement is short because the server parses it on every call: each
// token it leaves out is parser work saved (see docs/mysql.md,
// "Performance"). So returning (MariaDB) leaves out @txlimit_now, which
// RETURNING replaces; and a token bucket on the server's clock proposes a
// new row at the clock itself, which is newTS of the full state's time, the
// epoch, at any clock the server can read (its timestamps start after it).
func compile(kind algo.Kind, serverClock, reserve, returning bool) statement {
	const e, p, l = "@txlimit_e", "@txlimit_p", "@txlimit_l"
	tol := "CAST(:tol AS DOUBLE)"
	// The grant: a finite stored value of a row no sharded config wrote
	// (mysqlstore marks row 0 of a sharded limit with its number of shards
	// in prev, which the kinds served here leave 0: its other shards must
	// be pooled), and the count fits, or is a reservation within
	// MaxReserved whose wait is surely representable.
	fits := "(value BETWEEN -1e300 AND 1e300 AND prev = 0 AND " + l + " >= -" + tol + ")"
	// algo.TakeShards on one shard: what is left, floored at 0 within the
	// tolerance.
	newValue := "IF(" + l + " > 0, " + l + ", 0e0)"
	if reserve {
		fits = "(value BETWEEN -1e300 AND 1e300 AND prev = 0 AND (" + l + " >= -" + tol +
			" OR ((:capped = 0 OR " + p + " - CAST(:target AS DOUBLE) >= -" + tol + ")" +
			" AND (-" + l + " / CAST(:rate AS DOUBLE) + 2) * CAST(:period_f AS DOUBLE) + CAST(GREATEST(-" + e + ", 0) AS DOUBLE) < 2e15)))"
		newValue = "IF(" + l + " >= -" + tol + ", IF(" + l + " > 0, " + l + ", 0e0), " + l + ")"
	}
	fullTS := "CAST(:full_ts AS DATETIME(6))"
	createdTS := newTS(kind, fullTS, "TIMESTAMPDIFF(MICROSECOND, "+fullTS+", :now)")
	if kind == algo.TokenBucket && serverClock {
		createdTS = ":now" // algo.Full's time is 0, the epoch
	}
	set := "(@txlimit_ok := 1)"
	if !returning {
		set += " AND (@txlimit_now := :now) IS NOT NULL"
	}
	s := "INSERT INTO txlimit (name, `key`, shard, value, ts)\n" +
		"VALUES (:name, :key, 0, CAST(:full_value AS DOUBLE), IF(" + set + ", " + createdTS + ", NULL))\n" +
		"ON DUPLICATE KEY UPDATE\n" +
		"    value = IF((" + e + " := TIMESTAMPDIFF(MICROSECOND, ts, :now)) IS NULL\n" +
		"               OR (" + p + " := " + projected(kind, e) + ") IS NULL\n" +
		"               OR (" + l + " := " + p + " - CAST(:count AS DOUBLE)) IS NULL\n" +
		"               OR NOT (@txlimit_ok := " + fits + "),\n" +
		"               value, " + newValue + "),\n" +
		"    ts = " + advancedTS(kind, e) + ",\n" +
		// algo writes 0 for the third number of the kinds that do not use
		// it (a row a sliding window left).
		"    prev = IF(@txlimit_ok, 0e0, prev)"
	if serverClock {
		s = strings.ReplaceAll(s, ":now", "UTC_TIMESTAMP(6)")
	} else {
		s = strings.ReplaceAll(s, ":now", "CAST(:now AS DATETIME(6))")
	}
	st := split(s)
	st.parts[0] = header + st.parts[0]
	return st
}

// literal matches the statement's arguments: the ones it reads as DOUBLE or
// DATETIME(6) (group 1, the type in group 2), which Build writes into the
// statement as literals of that type, and the others (group 3), bound.
var literal = regexp.MustCompile(`CAST\(:([a-z_]+) AS (DOUBLE|DATETIME\(6\))\)|:([a-z_]+)`)

// split cuts the statement text s at its arguments.
func split(s string) statement {
	var st statement
	at := 0
	for _, m := range literal.FindAllStringSubmatchIndex(s, -1) {
		st.parts = append(st.parts, s[at:m[0]])
		at = m[1]
		switch {
		case m[2] >= 0 && s[m[4]:m[5]] == "DOUBLE":
			st.slots = append(st.slots, slot{name: s[m[2]:m[3]], as: asDouble})
		case m[2] >= 0:
			st.slots = append(st.slots, slot{name: s[m[2]:m[3]], as: asDatetime})
		default:
			st.slots = append(st.slots, slot{name: s[m[6]:m[7]], as: asBound})
		}
	}
	st.parts = append(st.parts, s[at:])
	return st
}

// statement is the statement for one form, cut at its arguments: parts[i]
// comes before slots[i], and the last part after the last slot.
type statement struct {
	parts []string
	slots []slot
}

// slot is one argument of a statement.
type slot struct {
	name string
	as   int
}

const (
	// asBound is bound as ?: the name and key, integers.
	asBound = iota
	// asDouble is written as a DOUBLE literal: the shortest decimal that
	// reads back as the float64, in exponent form (1e+09, (-5e-01)), which
	// MySQL and MariaDB read as an approximate-value (DOUBLE) literal,
	// correctly rounded (my_strtod). A bound float64 would be interpolated
	// by the driver as 0.5, a DECIMAL, and need a CAST: each CAST is parsed
	// and evaluated on every call.
	asDouble
	// asDatetime is written as a DATETIME(6) literal, TIMESTAMP'… .ffffff'
	// (six digits: the literal's type is DATETIME(6)).
	asDatetime
)

// form picks one compiled statement: the limit's kind, the server's clock
// or the call's, a reservation or a plain take, with RETURNING (MariaDB) or
// without (MySQL).
type form struct {
	kind                            algo.Kind
	serverClock, reserve, returning bool
}

// statements are the statement compiled for each form.
var statements = func() map[form]statement {
	out := map[form]statement{}
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.FixedWindow} {
		for _, serverClock := range []bool{true, false} {
			for _, reserve := range []bool{true, false} {
				for _, returning := range []bool{true, false} {
					out[form{kind, serverClock, reserve, returning}] = compile(kind, serverClock, reserve, returning)
				}
			}
		}
	}
	return out
}()

// SQL returns the statement for a limit of kind, on the server's clock or
// on the call's, for a reservation or a plain take, for RETURNING or not
// (RETURNING itself is not in it).
func SQL(kind algo.Kind, serverClock, reserve, returning bool) string {
	st := statements[form{kind, serverClock, reserve, returning}]
	var b strings.Builder
	for i, part := range st.parts {
		b.WriteString(part)
		if i < len(st.slots) {
			b.WriteString(":" + st.slots[i].name)
		}
	}
	return b.String()
}

// returning is what MariaDB (10.5 and later) returns of the row the
// statement wrote, appended to it: the row, whether it granted and the
// clock (the statement's own UTC_TIMESTAMP(6), the same instant; a call's
// own clock is the caller's), in the one round trip. MariaDB reads a user
// variable in RETURNING as the statement left it, except one that did not
// exist before the statement (the first call on a connection), which reads
// NULL; and one that is a plain operand or under CAST, which reads as it was
// before: hence "@txlimit_ok + 0", and ReadSQL after a NULL. MySQL has no
// RETURNING; ReadSQL reads the same in a second statement there.
const (
	returningServerClock = "\nRETURNING value, ts, @txlimit_ok + 0, UTC_TIMESTAMP(6)"
	returningCallClock   = "\nRETURNING value, ts, @txlimit_ok + 0"
)

// ReadSQL reads what the statement did, in the same transaction just after
// it: the row as the transaction now has it (its own write; a consistent
// read), the clock and whether it granted. It is bound by hand for the user
// variables, which sqlc cannot type.
const ReadSQL = `-- name: TakeRowRead :one
SELECT t.value, t.ts, CAST(@txlimit_now AS DATETIME(6)) AS clock, CAST(@txlimit_ok AS SIGNED) AS ok
FROM txlimit AS t
WHERE t.name = ? AND t.` + "`key`" + ` = ? AND t.shard = 0`

// readOKSQL is ReadSQL without the clock, which RETURNING gave: what the
// statement with RETURNING did, read after the connection's first call.
const readOKSQL = `-- name: TakeRowReadOK :one
SELECT t.value, t.ts, CAST(@txlimit_ok AS SIGNED) AS ok
FROM txlimit AS t
WHERE t.name = ? AND t.` + "`key`" + ` = ? AND t.shard = 0`

// Result is what the statement did and ReadSQL read back.
type Result struct {
	// Ran is false when the call did not fit a full bucket without a
	// reservation: the statement was not sent.
	Ran bool
	// Affected is the statement's affected-rows count without RETURNING: 1
	// when it created the row, 2 when it updated it, 0 when it left the row
	// as it was (ReadSQL is not run then). With RETURNING it is 0.
	Affected int64
	// Read reports that Value, TS, Clock and Granted were read.
	Read bool
	// Value and TS are the row as the transaction now has it, Clock the
	// clock of the call.
	Value     float64
	TS, Clock time.Time
	// Granted is the decision the statement made (@txlimit_ok).
	Granted bool
}

// Build returns the statement for p and its arguments (ok false when the
// call does not fit a full bucket without a reservation: nothing to send).
func Build(p driver.TakeParams, now *time.Time, returning bool) (query string, args []any, ok bool, err error) {
	c := p.Config
	full := p.Full()
	// A call on a missing row: the full state taken from, whose refill
	// leaves Capacity whatever the clock (driver.Fresh). A reservation on a
	// new key takes the locked path, whose decision on its wait depends on
	// the clock.
	fresh, ok := driver.Fresh(p)
	if !ok || fresh.Value < 0 {
		return "", nil, false, nil
	}
	fullValue := fresh.Value
	tol := 1e-9 * max(1, c.Capacity)
	s, ok := statements[form{c.Kind, now == nil, p.Reserve, returning}]
	if !ok {
		return "", nil, false, fmt.Errorf("takerow: unknown kind %v", c.Kind)
	}
	capped := 0
	if c.MaxReserved != 0 {
		capped = 1
	}
	values := map[string]any{
		"name": []byte(p.Name), "key": []byte(p.Key), "full_value": fullValue, "full_ts": time.UnixMicro(full.TS).UTC(),
		"count": p.Count, "tol": tol, "capped": capped, "target": p.Count - c.MaxReserved,
		"rate": c.Rate, "period": c.Period, "period_f": float64(c.Period), "capacity": c.Capacity,
	}
	if now != nil {
		values["now"] = now.UTC()
	}
	var b strings.Builder
	b.Grow(1536)
	var buf [32]byte
	for i, part := range s.parts {
		b.WriteString(part)
		if i == len(s.slots) {
			break
		}
		sl := s.slots[i]
		v, ok := values[sl.name]
		if !ok {
			return "", nil, false, fmt.Errorf("takerow: no value for :%s", sl.name)
		}
		switch sl.as {
		case asBound:
			b.WriteByte('?')
			args = append(args, v)
		case asDouble:
			f, ok := v.(float64)
			if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
				return "", nil, false, fmt.Errorf("takerow: :%s is %v, not a finite float64", sl.name, v)
			}
			if f < 0 || (f == 0 && math.Signbit(f)) {
				// In parentheses: "- -5e-01" must not read as a comment,
				// and -0 keeps its sign (the negation of 0e+00).
				b.WriteString("(-")
				b.Write(strconv.AppendFloat(buf[:0], -f, 'e', -1, 64))
				b.WriteByte(')')
			} else {
				b.Write(strconv.AppendFloat(buf[:0], f, 'e', -1, 64))
			}
		case asDatetime:
			t, ok := v.(time.Time)
			if !ok {
				return "", nil, false, fmt.Errorf("takerow: :%s is %v, not a time", sl.name, v)
			}
			b.WriteString("TIMESTAMP'")
			b.Write(t.UTC().AppendFormat(buf[:0], "2006-01-02 15:04:05.000000"))
			b.WriteByte('\'')
		}
	}
	return b.String(), args, true, nil
}

// Run runs the statement for p in tx, with RETURNING (MariaDB) when
// returning is set, else followed by ReadSQL when it changed a row. now is
// the call's clock, nil for the server's.
func Run(ctx context.Context, tx *sql.Tx, p driver.TakeParams, now *time.Time, returning bool) (Result, error) {
	query, args, ok, err := Build(p, now, returning)
	if err != nil || !ok {
		return Result{}, err
	}
	name, key := []byte(p.Name), []byte(p.Key)
	out := Result{Ran: true}
	var granted int64
	if returning {
		var ok sql.NullInt64
		var err error
		if now == nil {
			err = tx.QueryRowContext(ctx, query+returningServerClock, args...).Scan(&out.Value, &out.TS, &ok, &out.Clock)
		} else {
			err = tx.QueryRowContext(ctx, query+returningCallClock, args...).Scan(&out.Value, &out.TS, &ok)
			out.Clock = now.UTC()
		}
		if err != nil {
			return Result{}, err
		}
		if ok.Valid {
			out.Read, out.Granted = true, ok.Int64 == 1
			return out, nil
		}
		// The connection's first call: the variables exist now. The clock
		// is RETURNING's.
		err = tx.QueryRowContext(ctx, readOKSQL, name, key).Scan(&out.Value, &out.TS, &granted)
		if err != nil {
			return Result{}, err
		}
		out.Read, out.Granted = true, granted == 1
		return out, nil
	}
	r, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return Result{}, err
	}
	if out.Affected, err = r.RowsAffected(); err != nil || out.Affected == 0 {
		return out, err
	}
	err = tx.QueryRowContext(ctx, ReadSQL, name, key).Scan(&out.Value, &out.TS, &out.Clock, &granted)
	if errors.Is(err, sql.ErrNoRows) {
		return Result{}, errors.New("txlimit/mysqlstore: the row the one-statement take wrote is not there")
	}
	if err != nil {
		return Result{}, err
	}
	out.Read, out.Granted = true, granted == 1
	return out, nil
}
