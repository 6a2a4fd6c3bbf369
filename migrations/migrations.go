// Package migrations holds txlimit's schema as goose SQL migrations, one
// directory per dialect, embedded in the binary.
//
// Run them from the application's setup with Up. They are recorded in their
// own goose version table, VersionTable, so they never collide with the
// application's own goose history:
//
//	sqlDB := stdlib.OpenDBFromPool(pool) // github.com/jackc/pgx/v5/stdlib
//	if err := migrations.Up(ctx, sqlDB, migrations.Postgres); err != nil { … }
//
// Concurrent Up calls (several instances of the application starting at
// once) are serialized on PostgreSQL and MySQL by a lock row in LockTable,
// not by a session lock: see Provider for why.
//
// The files are plain goose migrations too: an application that prefers one
// history may copy migrations/postgres/*.sql (or sqlite/*.sql) into its own
// goose directory, renumbered to follow its own.
//
// On MySQL or MariaDB, open db with parseTime=true in the DSN (goose's lock
// row and mysqlstore read DATETIME columns); see the mysqlstore package.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable is the goose version table in which Up records txlimit's
// migrations.
const VersionTable = "txlimit_goose_version"

// LockTable is the table holding the lock row that serializes concurrent Up
// calls on PostgreSQL and MySQL (goose's table locker). It is created on first use in
// the current schema and keeps one row, unlocked between runs.
const LockTable = "txlimit_goose_lock"

// lockID is the lock row's id in LockTable: crc32 (IEEE) of "txlimit".
const lockID = 3683564439

// Dialect selects a set of migrations.
type Dialect string

const (
	// Postgres is for pgstore.
	Postgres Dialect = "postgres"
	// SQLite is for sqlitestore.
	SQLite Dialect = "sqlite"
	// MySQL is for mysqlstore, on MySQL 8.0.19+ and MariaDB 10.6+.
	MySQL Dialect = "mysql"
)

//go:embed postgres/*.sql sqlite/*.sql mysql/*.sql
var files embed.FS

// FS returns the migration files of dialect, at the root of the returned
// file system, for use with goose or any other tool.
func FS(dialect Dialect) (fs.FS, error) {
	switch dialect {
	case Postgres, SQLite, MySQL:
		return fs.Sub(files, string(dialect))
	}
	return nil, fmt.Errorf("txlimit/migrations: unknown dialect %q; use migrations.Postgres, migrations.SQLite or migrations.MySQL", dialect)
}

// Provider returns a goose provider for txlimit's migrations of dialect on
// db, recording them in VersionTable. Use it for more than Up: status,
// down, a specific version.
//
// On PostgreSQL the provider takes goose's table-based lock (a row in
// LockTable with a 30 s lease renewed every 5 s) around Up and Down, never a
// session advisory lock, so it is safe behind PgBouncer in transaction mode
// and on CockroachDB. Behind a transaction-mode pooler, open db with a pgx
// exec mode that does not prepare named statements
// (pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol): see
// docs/scale-out.md. On MySQL and MariaDB it takes the same kind of lock
// row, for the same reasons (see the comment at the locker); there db must
// be opened with parseTime=true.
func Provider(db *sql.DB, dialect Dialect) (*goose.Provider, error) {
	fsys, err := FS(dialect)
	if err != nil {
		return nil, err
	}
	gd := database.DialectPostgres
	switch dialect {
	case SQLite:
		gd = database.DialectSQLite3
	case MySQL:
		gd = database.DialectMySQL
	}
	store, err := database.NewStore(gd, VersionTable)
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithStore(store)}
	switch dialect {
	case Postgres:
		// Serialize concurrent Up calls (several app instances starting at
		// once) on a lock row, not on a session advisory lock. A session
		// lock belongs to a server connection: behind a pooler in
		// transaction mode (PgBouncer, PgCat, Supavisor) pg_advisory_unlock
		// may run on another server connection than the lock did, so the
		// lock leaks to whichever client gets that connection next and the
		// other instances wait until their deadline. A row in a table is
		// taken and released by ordinary autocommit statements, which work
		// through any pooler and on engines where advisory locks are no-ops
		// (CockroachDB). The lease makes a lock left by a crashed instance
		// expire after 30 s; the holder renews it every 5 s.
		locker, err := lock.NewPostgresTableLocker(
			lock.WithTableName(LockTable),
			lock.WithTableLockID(lockID),
			lock.WithTableLeaseDuration(30*time.Second),
			lock.WithTableHeartbeatInterval(5*time.Second),
			// Retry every second (±25% jitter) for up to 5 minutes; the
			// caller's context bounds it further.
			lock.WithTableLockTimeout(time.Second, 300),
			lock.WithTableUnlockTimeout(time.Second, 60),
		)
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithLocker(locker))
	case MySQL:
		// The same lock row, for the same reasons: GET_LOCK, MySQL's
		// session lock, holds only on the node that granted it in a
		// Galera cluster and belongs to a server connection that a proxy
		// (ProxySQL) may hand to another client. goose's MySQL locker reads
		// DATETIME columns, so db needs parseTime=true.
		locker, err := lock.NewMySQLTableLocker(
			lock.WithTableName(LockTable),
			lock.WithTableLockID(lockID),
			lock.WithTableLeaseDuration(30*time.Second),
			lock.WithTableHeartbeatInterval(5*time.Second),
			lock.WithTableLockTimeout(time.Second, 300),
			lock.WithTableUnlockTimeout(time.Second, 60),
		)
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithLocker(locker))
	}
	return goose.NewProvider("", db, fsys, opts...)
}

// Up applies every txlimit migration of dialect that db does not have yet.
// It is safe to run at every start of the application.
func Up(ctx context.Context, db *sql.DB, dialect Dialect) error {
	p, err := Provider(db, dialect)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("txlimit/migrations: %w", err)
	}
	return nil
}
