package mysqlstore

import (
	"context"
	"database/sql"
	"strings"

	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/engine"
	"github.com/txlimit/txlimit/mysqlstore/internal/takerow"
)

// TakeRow takes in one statement (package takerow) and reads what it did,
// in the same round trip on MariaDB (RETURNING), in a second on MySQL.
func (s *backend) TakeRow(ctx context.Context, tx *sql.Tx, p driver.TakeParams) (res driver.TakeResult, ok bool, err error) {
	maria := s.maria.Load()
	if maria == nil {
		version, err := queries.Version(ctx, tx)
		if err != nil {
			return driver.TakeResult{}, false, wrap(ctx, tx, "ask the server's version", err)
		}
		m := strings.Contains(strings.ToLower(version), "mariadb")
		maria = &m
		s.maria.Store(maria)
	}
	r, err := takerow.Run(ctx, tx, p, p.Now, *maria)
	if err != nil {
		return driver.TakeResult{}, false, wrap(ctx, tx, "take", err)
	}
	// Not read when not run (the call does not fit a full bucket) or, on
	// MySQL, when it changed no row: not granted, or granted without a
	// change, which the locked path grants again to the same effect. With
	// clientFoundRows a row left as it was counts as changed: Granted tells.
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
