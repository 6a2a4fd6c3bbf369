package mysqltest

import (
	"database/sql"
	"testing"

	"github.com/txlimit/txlimit/internal/storetest"
)

// TestMariaDB runs the conformance suite on the MySQL or MariaDB server
// the tests find (TEST_MYSQL_DSN or 127.0.0.1:3306); its subtests are named
// after the server (TestMariaDB/MariaDB_10.11/limits/…), so that -v shows
// which one passed.
func TestMariaDB(t *testing.T) {
	t.Parallel()
	t.Run(ServerName(t), func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, conns int32) storetest.Harness[*sql.Tx] {
			return Harness(Database(t, int(conns)))
		})
	})
}
