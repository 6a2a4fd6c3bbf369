#!/usr/bin/env bash
# The publish check (issue 35, docs/versioning.md): the modules install and
# build as a user gets them from a module proxy, with no replace and no
# network.
#
#   scripts/publishcheck.sh        # checks the commit HEAD points at
#
# 1. Every published module (scripts/modules.sh published) carries no
#    replace or exclude directive, requires the root at the version the
#    others require (R), and has the go.work that development builds with.
# 2. A temporary clone of this repository at HEAD gets test tags: the
#    root's and <dir>/<version> for every published module. The version T is
#    R when no tag R exists yet (the first release, or the next one being
#    prepared: HEAD is what tagging it now would publish); when R is
#    released already, T is R's next patch with -publishcheck, and the proxy
#    holds the root at R from its tag: the nested modules at HEAD must build
#    against the release they require. The real repository's tags are not
#    touched.
# 3. scripts/modproxy writes a proxy directory (the GOPROXY file layout)
#    from those tags: each module's zip as the go command makes it from
#    git, its go.mod, .info and @v/list.
# 4. The modules' third-party requirements are downloaded into the module
#    cache (go mod download in the root and each published module; a no-op
#    when they are there), whose cache/download is a GOPROXY tree too.
# 5. In an empty module, with GOPROXY=file://<proxy>,file://<cache/download>
#    (no https entry, no direct), GOSUMDB=off, GOFLAGS=-mod=mod, GOWORK=off,
#    a module cache of its own (nothing of the test versions reaches the
#    real one) and, where unshare(1) can, no network interface at all:
#    go get github.com/txlimit/txlimit@T and every published library module
#    @T, go mod tidy, build and run a program that uses the root package and
#    pgstore, build one that imports each library module; then, outside
#    any module, go install every published command @T
#    (github.com/txlimit/txlimit/cmd/txlimit@T) and run it with -help,
#    which must exit 0.
#
# It checks commits, not the work tree: commit first (it says when the tree
# has changes it leaves out). It needs the repository's tags (a clone
# without them takes R for unreleased and checks HEAD as R). -trimpath keeps the build cache shared with
# other runs although the module cache is a new one each time: the first run
# compiles the dependencies (a few minutes on 2 cores), later ones take
# seconds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rootpath=github.com/txlimit/txlimit
start=$SECONDS
step() { printf '\n--- %s (%ds)\n' "$*" $((SECONDS - start)); }
fail() { echo "publishcheck: $*" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/publishcheck.XXXXXX")"
cleanup() {
  chmod -R u+w "$tmp" 2>/dev/null || true # the module cache's files are read-only
  rm -rf "$tmp"
}
trap cleanup EXIT

cd "$root"
published="$(scripts/modules.sh published)"
step "published modules: $(echo $published)"
R="$(scripts/modules.sh root-version)"
for d in $published; do
  if grep -Eq '^[[:space:]]*(replace|exclude)([[:space:](]|$)' "$d/go.mod"; then
    fail "$d/go.mod has a replace or exclude directive: go install ...@version refuses it, and a published module carries none; its go.work replaces the root for development (DEVELOPERS.md, Modules)"
  fi
  [ -f "$d/go.work" ] || fail "$d has no go.work: development builds it against this checkout through one (copy cmd/txlimit/go.work)"
  echo "$d: requires $rootpath $R, no replace, go.work for development"
done
rev="$(git rev-parse HEAD)"
if [ -n "$(git status --porcelain)" ]; then
  echo "note: the work tree has changes that are not committed; the check builds commit ${rev:0:12} without them"
fi

step "a temporary clone at ${rev:0:12}, and test tags in it"
git clone -q --no-checkout "$root" "$tmp/repo"
git -C "$tmp/repo" checkout -q --detach "$rev"
tags=()
if git -C "$tmp/repo" rev-parse -q --verify "refs/tags/$R" >/dev/null; then
  base="${R%%[-+]*}"
  T="${base%.*}.$((${base##*.} + 1))-publishcheck"
  tags+=("$R")
  echo "$R is released (tag $R): the published modules at HEAD are tagged $T and build against the root at $R"
else
  T="$R"
  echo "$R is not tagged yet: HEAD is tagged $R, as the release would be"
fi
git -C "$tmp/repo" tag -f "$T" "$rev" >/dev/null
tags+=("$T")
for d in $published; do
  git -C "$tmp/repo" tag -f "$d/$T" "$rev" >/dev/null
  tags+=("$d/$T")
done
echo "tags: ${tags[*]}"

step "module proxy directory (scripts/modproxy)"
(cd scripts/modproxy && GOWORK=off go build -o "$tmp/modproxy" .)
"$tmp/modproxy" -repo "$tmp/repo" -out "$tmp/proxy" "${tags[@]}"

step "third-party modules in the module cache (go mod download)"
GOWORK=off go mod download
for d in $published; do scripts/modules.sh go "$d" mod download; done
cache="$(go env GOMODCACHE)/cache/download"

# The user's environment: nothing but the two proxy directories.
export GOPROXY="file://$tmp/proxy,file://$cache"
export GOSUMDB=off GONOSUMDB= GONOPROXY= GOPRIVATE= GOINSECURE= GOWORK=off GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -trimpath"
export GOMODCACHE="$tmp/modcache" GOBIN="$tmp/bin" GOPATH="$tmp/gopath"
offline=()
if unshare -n true 2>/dev/null; then
  offline=(unshare -n)
  echo "the go commands below run in a network namespace of their own (unshare -n): no network"
else
  echo "unshare -n is not permitted here: no network only by GOPROXY (no https entry, no direct)"
fi
gocmd="$(command -v go)"
go() { "${offline[@]}" "$gocmd" "$@"; }

step "an empty module: go get $rootpath@$T and the published library modules"
mkdir -p "$tmp/user/libs"
cd "$tmp/user"
go mod init example.com/publishcheck 2>/dev/null
cat >main.go <<'GO'
// A user's program: the root package and pgstore, as the README shows them.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlimit/txlimit"
	"github.com/txlimit/txlimit/pgstore"
)

var limits = map[string]txlimit.Config{
	"sendMessage": {Kind: txlimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 20},
}

func sendMessage(ctx context.Context, pool *pgxpool.Pool, limiter *txlimit.Limiter[pgx.Tx], user string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := limiter.LimitTx(ctx, tx, "sendMessage", user)
		if err != nil {
			return err
		}
		if !res.OK {
			return res.Err()
		}
		_, err = tx.Exec(ctx, `INSERT INTO messages (user_id) VALUES ($1)`, user)
		return err
	})
}

func main() {
	ctx := context.Background()
	// A pool connects on first use: the program runs without a server.
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:1/app")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pool.Close()
	limiter, err := txlimit.New(pgstore.New(pool), limits, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = sendMessage
	fmt.Printf("txlimit.New(pgstore.New(pool), ...): %T\n", limiter)
}
GO
libs=()
cmds=()
for d in $published; do
  case "$d" in
    cmd/*) cmds+=("$rootpath/$d") ;;
    *) libs+=("$rootpath/$d") ;;
  esac
done
{
  echo "// Package libs imports every published library module."
  echo "package libs"
  echo
  echo "import ("
  for m in "${libs[@]}"; do echo "	_ \"$m\""; done
  echo ")"
} >libs/libs.go
get=("$rootpath@$T")
for m in "${libs[@]}"; do get+=("$m@$T"); done
go get "${get[@]}"
go mod tidy
grep -Eq '^[[:space:]]*replace' go.mod && fail "the user's go.mod has a replace directive"
go list -m "$rootpath" "${libs[@]}"

step "build and run the program that uses txlimit and pgstore; build the library modules"
go build -o "$tmp/user.bin" .
"$tmp/user.bin"
go version -m "$tmp/user.bin" | grep -F "$rootpath" || fail "the program was not built from $rootpath@$T"
go build ./...
echo "go build ./... (libs: ${libs[*]}) ok"

cd "$tmp"
for m in "${cmds[@]}"; do
  step "go install $m@$T, outside any module, and ${m##*/} -help"
  go install "$m@$T"
  bin="$GOBIN/${m##*/}"
  go version -m "$bin" | grep -F "$rootpath"
  set +e
  "$bin" -help >"$tmp/help.out" 2>&1
  code=$?
  set -e
  head -n 3 "$tmp/help.out"
  [ "$code" -eq 0 ] || fail "${m##*/} -help exited $code, not 0"
  echo "${m##*/} -help: exit 0"
done

step "publishcheck: ok: the published modules at ${rev:0:12}, tagged $T, install and build from a module proxy with no replace"
