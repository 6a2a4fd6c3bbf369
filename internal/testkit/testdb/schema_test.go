package testdb

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit/migrations"
)

// TestSchemaMatchesGoose: Schema runs the migrations' Up statements itself
// instead of through goose; the tables, columns, constraints and indexes it
// makes are the ones goose makes (goose's version and lock tables aside).
func TestSchemaMatchesGoose(t *testing.T) {
	ddl, err := upSQL()
	if err != nil {
		t.Fatal(err)
	}
	if ddl == "" {
		t.Skip("a migration uses a goose annotation: Schema runs goose")
	}
	fast := Schema(t)
	viaGoose := EmptySchema(t)
	migrateWithGoose(t, viaGoose)
	got, want := describe(t, fast), describe(t, viaGoose)
	if len(want) == 0 {
		t.Fatal("goose made nothing")
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Schema:\n%s\n\ngoose:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// describe lists schema's relations, columns, constraints and indexes, with
// the schema's name left out, goose's own tables excluded.
func describe(t *testing.T, schema string) []string {
	t.Helper()
	const q = `
WITH rels AS (
  SELECT c.oid, c.relname, c.relkind FROM pg_class c
  WHERE c.relnamespace = $1::regnamespace AND c.relname::text NOT IN ($2::text, $3::text, $2::text || '_id_seq', $3::text || '_id_seq', $2::text || '_pkey', $3::text || '_pkey'))
SELECT format('rel %s %s', relname, relkind) FROM rels
UNION ALL
SELECT format('col %s.%s %s notnull=%s default=%s identity=%s generated=%s', r.relname, a.attname,
  format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated)
FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = r.oid AND d.adnum = a.attnum
UNION ALL
SELECT format('con %s.%s %s', r.relname, c.conname, pg_get_constraintdef(c.oid))
FROM rels r JOIN pg_constraint c ON c.conrelid = r.oid
UNION ALL
SELECT format('idx %s', pg_get_indexdef(i.indexrelid))
FROM rels r JOIN pg_index i ON i.indrelid = r.oid
ORDER BY 1`
	conn, err := pgx.Connect(context.Background(), URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), q, schema, migrations.VersionTable, migrations.LockTable)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i := range out {
		out[i] = strings.ReplaceAll(out[i], schema+".", "")
	}
	return out
}
