package queries

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRewrite(t *testing.T) {
	in := "unnest(sqlc.arg(names)::text[]) unnest(sqlc.arg(vals)::double precision[]) " +
		"sqlc.narg(tss)::timestamptz[] sqlc.arg(start)::integer sqlc.narg(now)::timestamptz"
	want := "unnest(sqlc.arg(names)::text::text[]) unnest(sqlc.arg(vals)::text::double precision[]) " +
		"sqlc.narg(tss)::text::timestamptz[] sqlc.arg(start)::integer sqlc.narg(now)::timestamptz"
	require.Equal(t, want, string(Rewrite([]byte(in))))
}

// TestDerivedIsCurrent fails when queries/postgres changed and the derived
// file was not regenerated (go generate . at the repository root).
func TestDerivedIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	want, err := Derive(root)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(root, Out))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "%s is stale: run go generate . at the repository root", Out)
	require.False(t, arrayParam.Match(got), "an array parameter was left as an array")
}
