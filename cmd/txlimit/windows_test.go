package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/algo"
	"github.com/txlimit/txlimit/internal/driver"
	"github.com/txlimit/txlimit/internal/testkit/testdb"
	"github.com/txlimit/txlimit/pgstore"
	"github.com/txlimit/txlimit/sqlitestore"
)

// The window shapes of docs/windows.md through the command: a sliding
// window and calendar windows, given by flags and by -config, their tokens
// checked against what the application's Limiter.Check says at the instant
// the command read them.

func TestSQLiteWindows(t *testing.T) {
	t.Parallel()
	path := testdb.SQLitePath(t)
	windows(t, path, func(t *testing.T, limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return newLimiterWith(t, sqlitestore.New(db), limits, opts)
	})
}

func TestPostgresWindows(t *testing.T) {
	t.Parallel()
	dsn := postgresDSN(t)
	windows(t, dsn, func(t *testing.T, limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[pgx.Tx] {
		pool, err := pgxpool.New(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return newLimiterWith(t, pgstore.New(pool), limits, opts)
	})
}

func newLimiterWith[TTx any](t *testing.T, store driver.Store[TTx], limits map[string]txlimit.Config, opts *txlimit.Options) *txlimit.Limiter[TTx] {
	t.Helper()
	l, err := txlimit.New(store, limits, opts)
	require.NoError(t, err)
	return l
}

// windows runs value and keys on limits of the new shapes on the database
// dsn, where the application's Limiter (from open) spends tokens at the
// instants the test sets.
func windows[TTx any](t *testing.T, dsn string, open func(*testing.T, map[string]txlimit.Config, *txlimit.Options) *txlimit.Limiter[TTx]) {
	ctx := context.Background()
	ok(t, "migrate", "up", "-dsn", dsn)

	now := time.UnixMicro(time.Now().UnixMicro()).UTC() // as stored: in µs
	// The sliding window's windows are [now-36h, now-12h) and
	// [now-12h, now+12h): the test runs in the second, with the first's
	// count as prev.
	slideStart := now.Add(-36 * time.Hour)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	newYork, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	local := now.In(berlin)
	month := time.Date(local.Year(), local.Month(), 1, 0, 0, 0, 0, berlin) // this Berlin month's start
	limits := map[string]txlimit.Config{
		"slide": {Kind: txlimit.SlidingWindow, Rate: 10, Period: 24 * time.Hour, Start: slideStart, Shards: 2},
		"month": {Kind: txlimit.Monthly, Rate: 100, Zone: "Europe/Berlin", Shards: 2},
		"week":  {Kind: txlimit.Weekly, Rate: 7, WeekStart: time.Monday, Zone: "America/New_York"},
	}
	config := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(config, []byte(`{
		"slide": {"kind": "sliding_window", "rate": 10, "period": "24h", "start": "`+slideStart.Format(time.RFC3339Nano)+`", "shards": 2},
		"month": {"kind": "monthly", "rate": 100, "zone": "Europe/Berlin", "shards": 2},
		"week": {"kind": "weekly", "rate": 7, "week_start": "Monday", "zone": "America/New_York"}
	}`), 0o600))
	// A flag given twice takes the last value: append "-shards", "3".
	slideFlags := []string{"-kind", "sliding_window", "-rate", "10", "-period", "24h", "-start", slideStart.Format(time.RFC3339Nano), "-shards", "2"}
	monthFlags := []string{"-kind", "monthly", "-rate", "100", "-zone", "Europe/Berlin", "-shards", "2"}
	weekFlags := []string{"-kind", "Weekly", "-rate", "7", "-week-start", "monday", "-zone", "America/New_York"}

	// The application, on a clock the test sets.
	var clock time.Time
	app := open(t, limits, &txlimit.Options{Clock: func() time.Time { return clock }})
	take := func(at time.Time, name, key string, n float64) {
		t.Helper()
		clock = at
		res, err := app.Limit(ctx, name, key, txlimit.Count(n))
		require.NoError(t, err)
		require.True(t, res.OK, "%s %s at %v", name, key, at)
	}
	// valueAt is what Limiter.Check says the limit holds at at.
	valueAt := func(name, key string, at time.Time) float64 {
		t.Helper()
		clock = at
		read, err := app.Check(ctx, name, key, txlimit.Count(0))
		require.NoError(t, err)
		return read.Remaining
	}
	take(now.Add(-13*time.Hour), "slide", "k", 6) // the previous window
	take(now.Add(-time.Hour), "slide", "k", 2)    // this one
	take(month.Add(-time.Hour), "month", "acme", 30)
	take(now, "month", "acme", 20)
	take(now, "week", "w", 3)

	valueJSON := func(args ...string) valueOutput {
		t.Helper()
		var v valueOutput
		require.NoError(t, json.Unmarshal([]byte(ok(t, append([]string{"value", "-json", "-dsn", dsn}, args...)...)), &v))
		var sum float64
		for _, s := range v.Shards {
			sum += s.Now
		}
		require.InDelta(t, v.Total, sum, 1e-9, "the shards add up to the total: %+v", v)
		return v
	}
	// valueText runs value and returns its output, requiring that its
	// TOTAL is what Limiter.Check says at the instant the command read.
	readAt := regexp.MustCompile(`read at (\S+) `)
	total := regexp.MustCompile(`(?m)^TOTAL\s+(\S+)\s+of `)
	valueText := func(args ...string) string {
		t.Helper()
		out := ok(t, append([]string{"value", "-dsn", dsn}, args...)...)
		m := readAt.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		at, err := time.Parse(time.RFC3339Nano, m[1])
		require.NoError(t, err)
		m = total.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		require.Equal(t, num(valueAt(args[0], args[1], at)), m[1], out)
		return out
	}

	// A sliding window: 10 - 2 - 6·(the part of the previous window still
	// covered, about half).
	var stored float64 // the rows' counts
	for _, args := range [][]string{{"-config", config}, slideFlags} {
		v := valueJSON(append([]string{"slide", "k"}, args...)...)
		require.Equal(t, valueAt("slide", "k", v.At), v.Total)
		require.InDelta(t, 5, v.Total, 0.01)
		require.Len(t, v.Shards, 2)
		prevs := 0
		stored = 0
		for _, s := range v.Shards {
			require.True(t, s.Row)
			stored += *s.Value
			if s.Prev != nil {
				prevs++
				require.Equal(t, 3.0, *s.Prev, "the previous window's 6, over 2 shards")
				require.Equal(t, slideStart.Add(24*time.Hour).UnixMicro(), s.TS.UnixMicro())
			}
		}
		require.Positive(t, prevs)
	}
	out := valueText(append([]string{"slide", "k"}, slideFlags...)...)
	require.Contains(t, out, "limit slide, key k: sliding window, 10 per 24h0m0s, capacity 10, 2 shard(s)")
	require.Regexp(t, `(?m)^SHARD\s+TOKENS NOW\s+STORED COUNT\s+STORED PREV\s+WINDOW START$`, out)
	require.Regexp(t, `(?m)^\d\s+\S+\s+\S+\s+3\s+`+regexp.QuoteMeta(slideStart.Add(24*time.Hour).Format(time.RFC3339Nano))+`$`, out)
	valueText("slide", "k", "-config", config)
	// No prev in the JSON of a kind that has none.
	require.NotContains(t, ok(t, "value", "week", "w", "-json", "-dsn", dsn, "-config", config), `"prev"`)

	// Another number of shards: the rows are pooled, as the Limiter reads
	// them, and the tokens are the same.
	more := valueJSON(append([]string{"slide", "k"}, append(slideFlags, "-shards", "3")...)...)
	require.True(t, more.Resharded)
	require.Len(t, more.Shards, 3)
	require.InDelta(t, valueAt("slide", "k", more.At), more.Total, 1e-9)
	fewer := valueJSON(append([]string{"slide", "k"}, append(slideFlags, "-shards", "1")...)...)
	require.True(t, fewer.Resharded)
	require.Len(t, fewer.Shards, 2)
	require.True(t, fewer.Shards[1].Ignored)
	require.InDelta(t, valueAt("slide", "k", fewer.At), fewer.Total, 1e-9)
	out = ok(t, append([]string{"value", "slide", "k", "-dsn", dsn}, append(slideFlags, "-shards", "1")...)...)
	require.Contains(t, out, "the rows were written under 2 shard(s): the limiter pools them and spreads them over 1")
	require.Contains(t, out, "(beyond shards 1: pooled into the shards above)")

	// A calendar month in Berlin: 30 taken last month, 20 this month.
	sameMonth := func(at time.Time) bool { return !at.Before(month) && at.Before(month.AddDate(0, 1, 0)) }
	for _, args := range [][]string{{"-config", config}, monthFlags} {
		v := valueJSON(append([]string{"month", "acme"}, args...)...)
		require.Equal(t, valueAt("month", "acme", v.At), v.Total)
		if sameMonth(v.At) {
			require.Equal(t, 80.0, v.Total)
			thisMonth := 0
			for _, s := range v.Shards {
				require.Nil(t, s.Prev)
				// A calendar row's ts is its last write.
				if s.Row && sameMonth(*s.TS) {
					thisMonth++
				} else if s.Row {
					require.True(t, !s.TS.Before(month.AddDate(0, -1, 0)) && s.TS.Before(month), "last month, not %v", s.TS.In(berlin))
				}
			}
			require.Positive(t, thisMonth)
		}
	}
	out = valueText(append([]string{"month", "acme"}, monthFlags...)...)
	require.Contains(t, out, "limit month, key acme: fixed window, 100 per calendar month in Europe/Berlin, capacity 100, 2 shard(s)")
	require.Regexp(t, `(?m)^SHARD\s+TOKENS NOW\s+STORED\s+UPDATED AT$`, out)
	require.Regexp(t, `T\d\d:\d\d:[\d.]+\+0[12]:00\n`, out, "a calendar row's last write, in its zone")
	valueText("month", "acme", "-config", config)

	// A week from Monday in New York.
	for _, args := range [][]string{{"-config", config}, weekFlags} {
		v := valueJSON(append([]string{"week", "w"}, args...)...)
		require.Equal(t, valueAt("week", "w", v.At), v.Total)
		require.Len(t, v.Shards, 1)
		require.True(t, v.Shards[0].TS.Equal(now), "a calendar row's ts is its last write, not %v", v.Shards[0].TS)
		_, end := algo.Calendar{Unit: algo.Week, Weekday: time.Monday, Location: newYork}.Window(now.UnixMicro())
		if !v.At.Before(time.UnixMicro(end)) {
			continue // the week ended while the test ran
		}
		require.Equal(t, 4.0, v.Total)
	}
	out = valueText(append([]string{"week", "w"}, weekFlags...)...)
	require.Contains(t, out, "fixed window, 7 per calendar week from Monday in America/New_York, capacity 7, 1 shard(s)")

	// keys: the shapes side by side, emptiest first, each key's tokens what
	// Limiter.Check says.
	all := keysJSON(t, "-dsn", dsn, "-config", config)
	require.Equal(t, []string{"slide/k", "week/w", "month/acme"}, names(all))
	for _, k := range all.Keys {
		require.Equal(t, valueAt(k.Name, k.Key, all.At), k.Tokens, k.Name)
		require.Equal(t, limits[k.Name].Rate, k.Capacity)
	}
	require.Equal(t, stored, all.Keys[0].Stored, "a sliding window's counts")
	for name, flags := range map[string][]string{"slide": slideFlags, "month": monthFlags, "week": weekFlags} {
		some := keysJSON(t, append([]string{name, "-dsn", dsn}, flags...)...)
		require.Len(t, some.Keys, 1)
		require.Equal(t, valueAt(name, some.Keys[0].Key, some.At), some.Keys[0].Tokens, name)
	}
}
