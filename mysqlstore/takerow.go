package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/mysqlstore/internal/takerow"
)

// TakeRow implements engine.Dialect: it takes from an unsharded limit in
// one statement and reads what it did, in the same round trip on MariaDB
// (RETURNING), in a second statement on MySQL (package takerow). ok is
// false when it granted nothing: the engine then takes the locked path.
func (s *backend) TakeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (res driver.TakeResult, ok bool, err error) {
	returning, err := s.mariaDB(ctx, tx)
	if err != nil {
		return driver.TakeResult{}, false, err
	}
	if p.Now != nil {
		if err := checkTime("the clock", *p.Now); err != nil {
			return driver.TakeResult{}, false, err
		}
	}
	r, err := takerow.Run(ctx, tx, p, p.Now, returning)
	if err != nil {
		return driver.TakeResult{}, false, wrap(ctx, tx, "take", err)
	}
	// Not run when the call does not fit a full bucket; not read (on MySQL)
	// when it changed no row: not granted, or granted without a change
	// (which the locked path grants again to the same effect). With
	// clientFoundRows=true a row left as it was counts as changed: Granted
	// tells.
	if !r.Read {
		return driver.TakeResult{}, false, nil
	}
	if err := checkUTC(r.TS, r.Clock); err != nil {
		return driver.TakeResult{}, false, err
	}
	if !r.Granted {
		return driver.TakeResult{}, false, nil
	}
	return engine.Granted(p, algo.State{Value: r.Value, TS: r.TS.UnixMicro()}, r.Clock), true, nil
}
