#!/usr/bin/env bash
# The repository's modules, which of them are published, and a go command
# that runs in a published module against this checkout's root module
# (docs/versioning.md, DEVELOPERS.md "Modules").
#
#   scripts/modules.sh all            # every module directory, the root (.) first
#   scripts/modules.sh published      # the nested modules tagged <dir>/vX.Y.Z
#   scripts/modules.sh unpublished    # the others: examples, tools, test helpers, the bench
#   scripts/modules.sh root-version   # the root version the published modules require
#   scripts/modules.sh go DIR ARGS... # go ARGS in module DIR, the root replaced by this checkout
#   scripts/modules.sh tidy [DIR...]       # go mod tidy in those modules (all when none)
#   scripts/modules.sh tidy -diff [DIR...] # CI: fails when a go.mod or go.sum is not tidy
#
# A nested module is published unless it is under examples/, tools/,
# internal/ or scripts/, or is the benchmark (cmd/txlimit-bench): a new
# top-level module is published by default, and
# scripts/publishcheck.sh holds it to the rules (no replace, the root at the
# version the others require, a go.work beside it).
#
# A published module requires a released (or the next) version of the root
# and carries no replace; its go.work replaces the root by this checkout
# for go build, vet and test. go mod tidy ignores go.work (and cannot fetch
# a root version that is not released yet), so `modules.sh go DIR ...` and
# `modules.sh tidy DIR` run the go command with GOWORK=off on a temporary
# copy of go.mod that has the go.work's replace (-modfile): the
# requirements are those of the root the module is built and tested with,
# which the next release publishes beside it. The copy of go.sum leaves out
# the root's own lines, which a directory replacement does not need; tidy
# then writes go.mod back without the replace. Other modules: GOWORK=off go
# mod tidy, as before.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rootpath=github.com/txlimit/txlimit

nested() { (cd "$root" && git ls-files '*/go.mod' | xargs -n1 dirname | sort); }

is_published() {
  case "$1" in
    examples/* | tools/* | internal/* | scripts/* | cmd/txlimit-bench) return 1 ;;
  esac
}

# required DIR: the version of the root module that DIR/go.mod requires, if any.
required() {
  awk -v p="$rootpath" '
    /^require[ \t]*\(/ { inreq = 1; next }
    inreq && /^\)/ { inreq = 0; next }
    inreq && $1 == p { print $2 }
    /^require[ \t]/ && $2 == p { print $3 }
  ' "$root/$1/go.mod"
}

case "${1:-}" in
  all)
    echo .
    nested
    ;;
  published)
    for d in $(nested); do if is_published "$d"; then echo "$d"; fi; done
    ;;
  unpublished)
    for d in $(nested); do if ! is_published "$d"; then echo "$d"; fi; done
    ;;
  root-version)
    versions="$(for d in $("$0" published); do required "$d"; done | sort -u)"
    if [ "$(printf '%s' "$versions" | grep -c .)" -ne 1 ]; then
      echo "modules.sh: the published modules require different root versions (or none): $(echo $versions)" >&2
      exit 1
    fi
    echo "$versions"
    ;;
  go)
    dir="${2:?usage: modules.sh go DIR ARGS...}"
    shift 2
    cd "$root/$dir"
    if [ ! -f go.work ] || [ -z "$(required "$dir")" ]; then
      # Not a published module (a replace in go.mod, or no dependency on the
      # root): its go.mod alone. GOWORK=off: no go.work of a parent directory.
      GOWORK=off exec go "$@"
    fi
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    cp go.mod "$tmp/go.mod"
    if [ -f go.sum ]; then grep -v "^$rootpath " go.sum >"$tmp/go.sum" || true; fi
    go mod edit -modfile="$tmp/go.mod" -replace "$rootpath=$root"
    GOWORK=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-modfile=$tmp/go.mod" go "$@"
    if [ -n "${MODULES_WRITE_BACK:-}" ]; then
      go mod edit -modfile="$tmp/go.mod" -dropreplace "$rootpath"
      cp "$tmp/go.mod" go.mod
      if [ -f "$tmp/go.sum" ]; then cp "$tmp/go.sum" go.sum; fi
    fi
    ;;
  tidy)
    shift
    diff=
    if [ "${1:-}" = -diff ]; then diff=-diff; shift; fi
    dirs="${*:-$("$0" all)}"
    for d in $dirs; do
      if [ -n "$diff" ]; then
        "$0" go "$d" mod tidy -diff
      else
        MODULES_WRITE_BACK=1 "$0" go "$d" mod tidy
      fi
    done
    ;;
  *)
    sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
