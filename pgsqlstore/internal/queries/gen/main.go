// Command gen writes pgsqlstore's queries, derived from queries/postgres (see
// package queries). Run from the repository root, as go generate does for
// doc.go.
package main

import (
	"log"
	"os"

	"github.com/txlimit/txlimit/pgsqlstore/internal/queries"
)

func main() {
	out, err := queries.Derive(".")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(queries.Out, out, 0o644); err != nil {
		log.Fatal(err)
	}
}
