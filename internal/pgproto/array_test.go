package pgproto

import (
	"database/sql"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/internal/testkit/testdb"
)

func TestArrayLiteral(t *testing.T) {
	var empty array
	require.Equal(t, "{}", empty.String())
	var a array
	a.text(`a"b\c`)
	a.text("")
	a.int(-3)
	a.float(0.1)
	a.float(math.Inf(-1))
	a.time(time.Date(2026, 3, 1, 12, 0, 0, 1000, time.FixedZone("x", 3600)))
	require.Equal(t, `{"a\"b\\c","",-3,0.1,-Infinity,"2026-03-01 11:00:00.000001+00"}`, a.String())
	require.Equal(t, a.String(), a.String(), "String does not change the literal")
}

// The literals read back on PostgreSQL as exactly the values they were
// built from, whatever the text holds.
func TestArrayLiteralOnPostgres(t *testing.T) {
	db := stdlib.OpenDBFromPool(testdb.Pool(t, testdb.Schema(t), pgx.QueryExecModeExec, 2))
	defer db.Close()

	texts := []string{"", "plain", `quote"d`, `back\slash`, "{brace}", "a,b", "NULL", " spaced ", "ünïcödé ☃", "new\nline", `\"`}
	var tl array
	for _, s := range texts {
		tl.text(s)
	}
	got := scanAll[string](t, db, "SELECT unnest($1::text::text[])", tl.String())
	require.Equal(t, texts, got)

	floats := []float64{0, -0.5, 1.0 / 3, math.MaxFloat64, math.SmallestNonzeroFloat64, -123456.789e-10, math.Inf(1)}
	var fl array
	for _, f := range floats {
		fl.float(f)
	}
	require.Equal(t, floats, scanAll[float64](t, db, "SELECT unnest($1::text::double precision[])", fl.String()))

	times := []time.Time{time.UnixMicro(0), time.UnixMicro(1772366400123456), time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC)}
	var ts array
	for _, tm := range times {
		ts.time(tm)
	}
	gotTimes := scanAll[time.Time](t, db, "SELECT unnest($1::text::timestamptz[])", ts.String())
	require.Len(t, gotTimes, len(times))
	for i := range times {
		require.True(t, times[i].Equal(gotTimes[i]), "%v != %v", times[i], gotTimes[i])
	}

	var il array
	il.int(math.MaxInt32)
	il.int(math.MinInt32)
	require.Equal(t, []int32{math.MaxInt32, math.MinInt32}, scanAll[int32](t, db, "SELECT unnest($1::text::integer[])", il.String()))
}

func scanAll[T any](t *testing.T, db *sql.DB, query string, args ...any) []T {
	t.Helper()
	rows, err := db.Query(query, args...)
	require.NoError(t, err)
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}
