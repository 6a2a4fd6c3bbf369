package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/driver"
	"github.com/txlimit/txlimit/mysqlstore/internal/takerow"
)

// takeRow takes from an unsharded limit in one statement and reads back
// what it did (package takerow). done is false when it granted nothing: the
// caller then takes the locked path.
func takeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (res driver.TakeResult, done bool, err error) {
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.TakeResult{}, false, err
		}
	}
	r, err := takerow.Run(ctx, tx, p, p.Now)
	if err != nil {
		return driver.TakeResult{}, false, wrap(ctx, tx, "take", err)
	}
	// Not run when the call does not fit a full bucket. Affected is 0 when
	// the call was not granted, or was granted without changing the row
	// (which the locked path grants again to the same effect). With
	// clientFoundRows=true a row left as it was counts 1: Granted tells.
	if !r.Ran || r.Affected == 0 {
		return driver.TakeResult{}, false, nil
	}
	if err := checkUTC(r.TS, r.Clock); err != nil {
		return driver.TakeResult{}, false, err
	}
	if !r.Granted {
		return driver.TakeResult{}, false, nil
	}
	next := algo.State{Value: r.Value, TS: r.TS.UnixMicro()}
	return driver.TakeResult{Decision: driver.Granted(p.Config, next, r.Clock.UnixMicro()), At: r.Clock, States: []algo.State{next},
		Taken: p.Count}, true, nil
}
