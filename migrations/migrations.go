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
// The files are plain goose migrations too: an application that prefers one
// history may copy migrations/postgres/*.sql (or sqlite/*.sql) into its own
// goose directory, renumbered to follow its own.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable is the goose version table in which Up records txlimit's
// migrations.
const VersionTable = "txlimit_goose_version"

// Dialect selects a set of migrations.
type Dialect string

const (
	// Postgres is for pgstore.
	Postgres Dialect = "postgres"
	// SQLite is for sqlitestore.
	SQLite Dialect = "sqlite"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// FS returns the migration files of dialect, at the root of the returned
// file system, for use with goose or any other tool.
func FS(dialect Dialect) (fs.FS, error) {
	switch dialect {
	case Postgres, SQLite:
		return fs.Sub(files, string(dialect))
	}
	return nil, fmt.Errorf("txlimit/migrations: unknown dialect %q; use migrations.Postgres or migrations.SQLite", dialect)
}

// Provider returns a goose provider for txlimit's migrations of dialect on
// db, recording them in VersionTable. Use it for more than Up: status,
// down, a specific version.
func Provider(db *sql.DB, dialect Dialect) (*goose.Provider, error) {
	fsys, err := FS(dialect)
	if err != nil {
		return nil, err
	}
	gd := database.DialectPostgres
	if dialect == SQLite {
		gd = database.DialectSQLite3
	}
	store, err := database.NewStore(gd, VersionTable)
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithStore(store)}
	if dialect == Postgres {
		// Serialize concurrent Up calls (several app instances starting at
		// once) on a PostgreSQL advisory lock.
		locker, err := lock.NewPostgresSessionLocker()
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithSessionLocker(locker))
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
