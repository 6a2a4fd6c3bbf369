package mysqlstore_test

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
)

// TestMariaDB runs the conformance suite on the MySQL or MariaDB server
// the tests find (TEST_MYSQL_DSN or 127.0.0.1:3306), with the callers'
// transactions at InnoDB's default isolation, REPEATABLE READ, and at READ
// COMMITTED; its subtests are named after the server
// (TestMariaDB/MariaDB_10.11/repeatable_read/limits/…), so that -v shows
// which one passed.
func TestMariaDB(t *testing.T) {
	t.Parallel()
	t.Run(mysqltest.ServerName(t), func(t *testing.T) {
		for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted} {
			t.Run(strings.ReplaceAll(strings.ToLower(iso.String()), " ", "_"), func(t *testing.T) {
				storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[*sql.Tx] {
					return mysqltest.Harness(mysqltest.Database(t, int(conns)), iso)
				})
			})
		}
	})
}

// req is one limit of a LimitAll call.
func req(name, key string, opts ...txlimit.Option) txlimit.Request {
	return txlimit.Request{Name: name, Key: key, Options: opts}
}
