package mysqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txlimit/txlimit/mysqlstore/internal/rawsql"
)

// The store's packages look each of their statements in
// internal/rawsql/*.sql up by name when they are initialized, which panics
// on a name the files lack (so that no test runs), and leaves none of the
// files' statements unused.
func TestRawStatementsAreAllUsed(t *testing.T) {
	require.Empty(t, rawsql.Unused(), "statements in mysqlstore/internal/rawsql/*.sql that the store never runs: delete them, or run them")
	require.PanicsWithValue(t, `rawsql: no statement "Missing" in mysqlstore/internal/rawsql/*.sql; add it under a "-- name: Missing" header`,
		func() { rawsql.Get("Missing") })
}
