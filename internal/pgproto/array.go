package pgproto

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// array builds a PostgreSQL array literal ({"a","b"}), the text form in
// which both stores send array parameters: database/sql has no array type,
// and the statements cast the text to the array type on the server (see
// queries/postgres/txlimit.sql). Every element is quoted, so no value can
// change the literal's structure.
type array struct {
	b strings.Builder
	n int
}

func (a *array) next() {
	if a.n == 0 {
		a.b.WriteByte('{')
	} else {
		a.b.WriteByte(',')
	}
	a.n++
}

// text adds s, quoted, with backslash and double quote escaped.
func (a *array) text(s string) {
	a.next()
	a.b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			a.b.WriteByte('\\')
		}
		a.b.WriteByte(s[i])
	}
	a.b.WriteByte('"')
}

func (a *array) int(v int32) {
	a.next()
	a.b.WriteString(strconv.FormatInt(int64(v), 10))
}

// float adds v in the shortest form that reads back as exactly v.
func (a *array) float(v float64) {
	a.next()
	switch {
	case math.IsInf(v, 1):
		a.b.WriteString("Infinity")
	case math.IsInf(v, -1):
		a.b.WriteString("-Infinity")
	case math.IsNaN(v):
		a.b.WriteString("NaN")
	default:
		a.b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	}
}

// time adds t in UTC at microsecond precision, the precision of timestamptz.
func (a *array) time(t time.Time) {
	a.next()
	a.b.WriteByte('"')
	a.b.WriteString(t.UTC().Format("2006-01-02 15:04:05.999999"))
	a.b.WriteString("+00")
	a.b.WriteByte('"')
}

// String returns the literal; {} for no element.
func (a *array) String() string {
	if a.n == 0 {
		return "{}"
	}
	return a.b.String() + "}"
}
