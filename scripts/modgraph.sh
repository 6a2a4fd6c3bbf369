#!/usr/bin/env bash
# Counts the modules a user of txlimit gets: builds a fresh module in a temp
# dir that imports txlimit and pgstore, requires the root at the version the
# published modules require (scripts/modules.sh root-version), points it at
# this checkout with a replace directive (a released version is not needed
# to count; scripts/publishcheck.sh builds a user's module without one),
# runs go mod tidy, and counts `go list -m all` (the user's module
# included, as the issue's 77 did not: 78 lines before).
# Fails when the count is above the bound: issue 12's 32, and 2 for
# go-sql-driver/mysql and filippo.io/edwards25519, the MySQL store's test
# driver (a test-only requirement of the root module, so that go test ./...
# runs the MariaDB suite; nothing of them is compiled into a user's program).
#
#   scripts/modgraph.sh          # print the count, fail above 34
#   scripts/modgraph.sh -v       # also list the modules
set -euo pipefail
MAX_MODULES=34
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$("$root/scripts/modules.sh" root-version)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/go.mod" <<MOD
module example.com/txlimituser

go 1.26.0

require github.com/txlimit/txlimit $version

replace github.com/txlimit/txlimit => $root
MOD

cat >"$tmp/main.go" <<'GO'
package main

import (
	"github.com/jackc/pgx/v5"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

var (
	_ = txlimit.New[pgx.Tx]
	_ = pgstore.New
)

func main() {}
GO

cd "$tmp"
export GOWORK=off GOFLAGS=-mod=mod
go mod tidy
go build ./...
modules="$(go list -m all)"
count="$(printf '%s\n' "$modules" | wc -l)"
if [ "${1:-}" = "-v" ]; then printf '%s\n' "$modules"; fi
echo "a module importing txlimit and pgstore lists $count modules in go list -m all (bound $MAX_MODULES)"
if [ "$count" -gt "$MAX_MODULES" ]; then
  echo "too many modules: keep heavy dependencies in nested modules (DEVELOPERS.md, Modules)" >&2
  exit 1
fi
