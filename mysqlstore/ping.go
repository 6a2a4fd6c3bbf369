package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/sqltx"
	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// ping is driver.Ops.Ping: the server is MySQL 8.0.19+ or MariaDB 10.6+,
// the DSN has the settings the store needs (ErrDSN naming the parameter;
// each told apart by what the driver does, since the store imports no
// driver), and the txlimit table has every column the library uses
// (txlimit.ErrNotMigrated). Without a db it is driver.ErrNoPool, which the
// Limiter reports as an *txlimit.InvalidError.
func ping(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return driver.ErrNoPool
	}
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	if err := checkVersion(ctx, db); err != nil {
		return err
	}
	if err := checkTimes(ctx, db); err != nil {
		return err
	}
	if err := queries.ProbeTable(ctx, db); err != nil {
		return wrap(ctx, db, "ping", err)
	}
	if err := checkFoundRows(ctx, db); err != nil {
		return err
	}
	return checkInterpolation(ctx, db)
}

var preparedCount = rawsql.Get("PreparedCount").SQL

var versionNumbers = regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)`)

// checkVersion asks for the server's version: a database that is not MySQL
// answers with an error, and an older MySQL or MariaDB lacks what the store
// uses (SKIP LOCKED, JSON_TABLE, CAST AS DOUBLE, ON DUPLICATE KEY UPDATE that
// refers to the SELECT's columns).
func checkVersion(ctx context.Context, db *sql.DB) error {
	version, err := queries.Version(ctx, db)
	if err != nil {
		if wrong := sqltx.WrongDatabase(ctx, db, err, ErrWrongDatabase, sqltx.MySQL); wrong != nil {
			return wrong
		}
		return driver.Setup(fmt.Errorf("txlimit/mysqlstore: ping: %w: %w", ErrWrongDatabase, err))
	}
	m := versionNumbers.FindStringSubmatch(version)
	if m == nil {
		return nil // a version string of another form: let the statements tell
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	patch, _ := strconv.Atoi(m[3])
	v := major*1_000_000 + minor*1_000 + patch
	if strings.Contains(strings.ToLower(version), "mariadb") {
		if v < 10_006_000 {
			return driver.Setup(fmt.Errorf("%w: it is MariaDB %s; mysqlstore needs MariaDB 10.6 or later (SKIP LOCKED, JSON_TABLE)", ErrWrongDatabase, version))
		}
		return nil
	}
	if v < 8_000_019 {
		return driver.Setup(fmt.Errorf("%w: it is MySQL %s; mysqlstore needs MySQL 8.0.19 or later", ErrWrongDatabase, version))
	}
	return nil
}

// checkTimes reads the clock as the store reads every time: without
// parseTime=true the driver gives a DATETIME as bytes, which wrap names, and
// with loc set to another zone it reads the server's UTC times in that zone.
func checkTimes(ctx context.Context, db *sql.DB) error {
	t, err := queries.Clock(ctx, db)
	if err != nil {
		return wrap(ctx, db, "ping", err)
	}
	return checkUTC(t)
}

// checkFoundRows tells clientFoundRows=true by what it does (ProbeFoundRows).
// The store reads that count to tell a grant from a denial in one statement
// (TakeRow), so with clientFoundRows=true a denial costs a round trip more.
// The probe also shows that the user may write the table.
func checkFoundRows(ctx context.Context, db *sql.DB) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var n int64
	for range 2 {
		if n, err = queries.ProbeFoundRows(ctx, tx); err != nil {
			return wrap(ctx, tx, "ping: write a row in a transaction it rolls back", err)
		}
	}
	if n != 0 {
		return dsnError("remove clientFoundRows from the DSN (or set clientFoundRows=false): the store counts the rows a " +
			"statement changed, and with it the driver counts the rows it found")
	}
	return nil
}

// checkInterpolation tells interpolateParams=false by what the server
// counts: a query with an argument then prepares a statement on the server
// (Com_stmt_prepare), run in a second round trip.
func checkInterpolation(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	defer conn.Close()
	prepared := func() (int64, error) {
		var name string
		var n int64
		err := conn.QueryRowContext(ctx, preparedCount).Scan(&name, &n)
		return n, err
	}
	before, err := prepared()
	if err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	if _, err := queries.Echo(ctx, conn, 1); err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	after, err := prepared()
	if err != nil {
		return fmt.Errorf("txlimit/mysqlstore: ping: %w", err)
	}
	if after > before {
		return dsnError("add interpolateParams=true to the DSN: without it the driver prepares every statement that " +
			"has arguments on the server and runs it in a second round trip, which doubles what a limited call costs")
	}
	return nil
}
