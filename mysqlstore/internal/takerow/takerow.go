// Package takerow is mysqlstore's one-statement take: an admitted call on an
// unsharded limit as one INSERT … ON DUPLICATE KEY UPDATE that refills,
// decides and writes with algo's arithmetic in SQL (the statements of
// mysqlstore/internal/rawsql/take.sql, which says how), and
// what it did, read with RETURNING on MariaDB and by a second statement on
// MySQL. It is a package of its own so that the differential test in
// mysqlstore's tests, which runs on a real server, can hold the statement
// itself, not only the store's whole Take, to algo.
package takerow

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// The statements: per kind, one for a plain take on the server's clock and
// one for any call (take.sql says why). On MariaDB the take returns what it
// did (TakeReturning appended), in one round trip; on MySQL TakeRead reads
// it.
var (
	bucket, bucketAny = rawsql.Get("TakeBucket"), rawsql.Get("TakeBucketAny")
	window, windowAny = rawsql.Get("TakeWindow"), rawsql.Get("TakeWindowAny")
	returning         = "\n" + rawsql.Get("TakeReturning").SQL
	read, readOK      = rawsql.Get("TakeRead"), rawsql.Get("TakeReadOK")
)

// Result is what the statement did and TakeRead read back.
type Result struct {
	// Ran is false when the call did not fit a full bucket without a
	// reservation: the statement was not sent.
	Ran bool
	// Affected is the statement's affected-rows count without RETURNING: 1
	// when it created the row, 2 when it updated it, 0 when it left the row
	// as it was (TakeRead is not run then). With RETURNING it is 0.
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

// Run runs the statement for p in tx, with RETURNING (MariaDB) when
// withReturning is set, else followed by TakeRead when it changed a row. now
// is the call's clock, nil for the server's. p's kind must be one
// driver.InSQL admits.
func Run(ctx context.Context, tx *sql.Tx, p driver.TakeParams, now *time.Time, withReturning bool) (Result, error) {
	// A call on a missing row: the full state taken from, whose refill
	// leaves Capacity whatever the clock. A reservation on a new key takes
	// the locked path, whose decision on its wait depends on the clock.
	fresh, ok := driver.Fresh(p)
	if !ok || fresh.Value < 0 {
		return Result{}, nil
	}
	c := p.Config
	var clock any // NULL: the server's
	if now != nil {
		clock = now.UTC()
	}
	st := bucket
	switch plain := !p.Reserve && now == nil; {
	case c.Kind == algo.FixedWindow && plain:
		st = window
	case c.Kind == algo.FixedWindow:
		st = windowAny
	case !plain:
		st = bucketAny
	}
	query := st.SQL
	if withReturning {
		query += returning
	}
	name, key := []byte(p.Name), []byte(p.Key)
	args := st.Args(map[string]any{
		"name": name, "key": key, "now": clock, "full_value": fresh.Value, "full_ts": time.UnixMicro(p.Full().TS).UTC(),
		"count": p.Count, "tol": 1e-9 * max(1, c.Capacity), "reserve": p.Reserve, "capped": c.MaxReserved != 0,
		"target": p.Count - c.MaxReserved, "rate": c.Rate, "period": c.Period, "period_f": float64(c.Period), "capacity": c.Capacity,
	})
	keyArgs := map[string]any{"name": name, "key": key}
	out := Result{Ran: true}
	var granted int64
	if withReturning {
		var ok sql.NullInt64
		if err := tx.QueryRowContext(ctx, query, args...).Scan(&out.Value, &out.TS, &ok, &out.Clock); err != nil {
			return Result{}, err
		}
		if now != nil {
			out.Clock = now.UTC()
		}
		if ok.Valid {
			out.Read, out.Granted = true, ok.Int64 == 1
			return out, nil
		}
		// The connection's first call: the variables exist now. The clock
		// is RETURNING's.
		if err := tx.QueryRowContext(ctx, readOK.SQL, readOK.Args(keyArgs)...).Scan(&out.Value, &out.TS, &granted); err != nil {
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
	err = tx.QueryRowContext(ctx, read.SQL, read.Args(keyArgs)...).Scan(&out.Value, &out.TS, &out.Clock, &granted)
	if errors.Is(err, sql.ErrNoRows) {
		return Result{}, errors.New("txlimit/mysqlstore: the row the one-statement take wrote is not there")
	}
	if err != nil {
		return Result{}, err
	}
	out.Read, out.Granted = true, granted == 1
	return out, nil
}
