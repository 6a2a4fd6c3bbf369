#!/usr/bin/env bash
# Runs the pinned sqlc, installing it first when it is missing or another
# version. sqlc compiles a cgo parser, so the first install takes minutes.
#
#   scripts/sqlc.sh generate   # regenerate */internal/db from queries/
#   scripts/sqlc.sh diff       # fail when the committed code is not current
set -euo pipefail
SQLC_VERSION=v1.31.1
cd "$(dirname "$0")/.."
bin="$(go env GOPATH)/bin/sqlc"
if [ ! -x "$bin" ] || [ "$("$bin" version 2>/dev/null)" != "$SQLC_VERSION" ]; then
  echo "installing sqlc $SQLC_VERSION (compiles a cgo parser; takes a few minutes)" >&2
  CGO_ENABLED=1 go install "github.com/sqlc-dev/sqlc/cmd/sqlc@$SQLC_VERSION"
fi
exec "$bin" "$@"
