package sqlitestore_test

import (
	"database/sql"
	"testing"

	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/sqlitestore"
)

// TestSQLite runs the conformance suite on SQLite.
func TestSQLite(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[*sql.Tx] {
		db := testdb.OpenSQLite(t)
		if conns > 16 { // the concurrency topic's acquirers, each on a connection of its own
			db.SetMaxOpenConns(int(conns))
			db.SetMaxIdleConns(int(conns))
		}
		return testdb.SQLiteHarness(db, sqlitestore.New(db))
	})
}
