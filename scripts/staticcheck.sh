#!/usr/bin/env bash
# Runs the pinned staticcheck, installing it first when it is missing or
# another version. Run it from a module's directory, like go vet:
#
#   scripts/staticcheck.sh ./...
#   (cd cmd/txlimit-bench && ../../scripts/staticcheck.sh ./...)
set -euo pipefail
STATICCHECK_VERSION=v0.8.2
bin="$(go env GOPATH)/bin/staticcheck"
if [ ! -x "$bin" ] || ! "$bin" -version 2>/dev/null | grep -qF "(${STATICCHECK_VERSION#v})"; then
  echo "installing staticcheck $STATICCHECK_VERSION" >&2
  (cd / && GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION")
fi
exec "$bin" "$@"
