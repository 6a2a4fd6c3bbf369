package mysqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/internal/testkit/mysqltest"
	"github.com/txlimit/txlimit/internal/testkit/storetest"
	"github.com/txlimit/txlimit/migrations"
	"github.com/txlimit/txlimit/mysqlstore"
)

// The inputs that are hostile on MySQL in particular (the suite's table of
// bad input runs in TestMariaDB), each on a server set up as the
// application's may be: a database and a connection whose character set is
// utf8mb3, which cannot hold 4-byte UTF-8; and a session sql_mode without
// STRICT_TRANS_TABLES, under which MySQL truncates a value too long for its
// column, or stores a zero date for an invalid one, with a warning instead
// of an error. The key columns are VARBINARY and sized to the limiter's own
// bounds, so none of it reaches them.
func TestMySQLHostileInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := mysqltest.EmptyDatabase(t)
	admin := mysqltest.Open(t, cfg, 1)
	_, err := admin.Exec("ALTER DATABASE " + cfg.DBName + " CHARACTER SET utf8mb3 COLLATE utf8mb3_general_ci")
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, mysqltest.Open(t, cfg, 2), migrations.MySQL))

	for _, setup := range []struct {
		desc   string
		params map[string]string
	}{
		{"utf8mb3 connection", map[string]string{"charset": "utf8"}},
		{"sql_mode without STRICT", map[string]string{"sql_mode": "'NO_ENGINE_SUBSTITUTION'"}},
		{"utf8mb3 connection without interpolateParams", map[string]string{"charset": "utf8", "interpolateParams": "false"}},
	} {
		t.Run(setup.desc, func(t *testing.T) {
			c := cfg.Clone()
			for k, v := range setup.params {
				if k == "interpolateParams" {
					c.InterpolateParams = v == "true"
					continue
				}
				if c.Params == nil {
					c.Params = map[string]string{}
				}
				c.Params[k] = v
			}
			db := mysqltest.Open(t, c, 3)
			var mode, charset string
			require.NoError(t, db.QueryRow("SELECT @@SESSION.sql_mode, @@SESSION.character_set_client").Scan(&mode, &charset))
			if _, lax := setup.params["sql_mode"]; lax {
				require.NotContains(t, mode, "STRICT")
			} else {
				require.Equal(t, "utf8mb3", charset)
			}
			at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			clock := func() time.Time { return at }
			hourly := txlimit.Config{Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour}
			name := "hostile🙂 " + setup.desc
			l, err := txlimit.New(mysqlstore.New(db), map[string]txlimit.Config{name: hourly}, &txlimit.Options{Clock: func() time.Time { return clock() }})
			require.NoError(t, err)
			limit := func(key string) txlimit.Result {
				t.Helper()
				res, err := l.Limit(ctx, name, key)
				require.NoError(t, err, "%q", key)
				return res
			}

			// 4-byte UTF-8, keys that differ only in case, in trailing
			// spaces (equal under a PAD SPACE or _ci collation) or in
			// Unicode normalization, and keys that look like SQL: each is
			// a limit of its own.
			keys := []string{"🙂", "🙃", "k", "K", "k ", "k  ", "'; DROP TABLE txlimit; --", `\`, "%", "_", "\u00e9", "e\u0301"}
			for _, k := range keys {
				require.True(t, limit(k).OK)
			}
			for _, k := range keys {
				require.True(t, limit(k).OK)
				require.False(t, limit(k).OK, "%q: two tokens, each key its own limit", k)
				require.Len(t, mysqltest.Rows(t, admin, name, k), 1, "%q", k)
			}

			// The longest key (MaxKeyLen bytes, here 4-byte characters)
			// and name fit the primary key; one byte more is bad input,
			// refused before anything is written, never truncated into
			// another key.
			longest := strings.Repeat("🙂", storetest.MaxKeyLen/4)
			require.True(t, limit(longest).OK)
			require.True(t, limit(longest).OK)
			require.False(t, limit(longest).OK)
			var invalid *txlimit.InvalidError
			_, err = l.Limit(ctx, name, longest+"x")
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, "key", invalid.Field)
			require.Empty(t, mysqltest.Rows(t, admin, name, longest+"x"))
			require.Len(t, mysqltest.Rows(t, admin, name, longest), 1)
			// A name is at most 256 bytes (the limiter's own bound, not
			// exported; VARBINARY(256) here).
			longName := strings.Repeat("n", 256)
			_, err = l.Limit(ctx, longName, "k", txlimit.Inline(hourly))
			require.NoError(t, err)
			_, err = l.Limit(ctx, longName+"n", "k", txlimit.Inline(hourly))
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, "name", invalid.Field)
			require.Empty(t, mysqltest.Rows(t, admin, longName+"n", "k"))

			// A clock outside what DATETIME(6) holds (the store's
			// ClockRange) is bad input, refused before any statement: a lax
			// sql_mode would store a zero date.
			for _, bad := range []time.Time{time.Date(999, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)} {
				clock = func() time.Time { return bad }
				for _, shards := range []int{1, 3} {
					cfg := txlimit.Inline(txlimit.Config{Kind: txlimit.TokenBucket, Rate: 2, Period: time.Hour, Shards: shards})
					_, err := l.Limit(ctx, name, "far", cfg)
					require.ErrorAs(t, err, &invalid)
					require.Equal(t, "Options.Clock", invalid.Field)
					_, err = l.LimitAll(ctx, req(name, "far", cfg))
					require.ErrorAs(t, err, &invalid)
					require.Equal(t, "Options.Clock", invalid.Field)
					require.Empty(t, mysqltest.Rows(t, admin, name, "far"))
				}
			}
			var zero int
			require.NoError(t, admin.QueryRow("SELECT COUNT(*) FROM txlimit WHERE ts < '1000-01-01'").Scan(&zero))
			require.Zero(t, zero)
		})
	}
}
