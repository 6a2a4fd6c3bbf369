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
type array []string

var escape = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// text adds s, quoted, with backslash and double quote escaped.
func (a *array) text(s string) { *a = append(*a, `"`+escape.Replace(s)+`"`) }

func (a *array) int(v int32) { *a = append(*a, strconv.Itoa(int(v))) }

// float adds v in the shortest form that reads back as exactly v, and the
// infinities as PostgreSQL spells them.
func (a *array) float(v float64) {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	switch {
	case math.IsInf(v, 1):
		s = "Infinity"
	case math.IsInf(v, -1):
		s = "-Infinity"
	}
	*a = append(*a, s)
}

// time adds t in UTC at microsecond precision, the precision of timestamptz.
func (a *array) time(t time.Time) {
	*a = append(*a, `"`+t.UTC().Format("2006-01-02 15:04:05.999999")+`+00"`)
}

// String returns the literal; {} for no element.
func (a *array) String() string { return "{" + strings.Join(*a, ",") + "}" }
