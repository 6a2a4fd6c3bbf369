#!/usr/bin/env bash
# Runs a private PostgreSQL under valgrind's callgrind, which counts the
# instructions each backend executes: a measure of what a statement costs the
# server that does not move with the machine's load (timings on a shared
# 2-core machine do). BenchmarkServerInstructions reads the counts.
#
#   scripts/callgrind.sh start    # cluster on 127.0.0.1:7501, counts in /tmp/txlimit-callgrind
#   TXLIMIT_CALLGRIND=/tmp/txlimit-callgrind \
#   TEST_DATABASE_URL='postgres://postgres@127.0.0.1:7501/postgres?sslmode=disable' \
#     go test -run '^$' -bench ServerInstructions -benchtime 1x .
#   scripts/callgrind.sh stop
#
# Needs valgrind and PostgreSQL's server binaries (Debian: valgrind,
# postgresql); runs the server as the postgres user when started as root.
set -euo pipefail
port="${CALLGRIND_PORT:-7501}"
out="${TXLIMIT_CALLGRIND:-/tmp/txlimit-callgrind}"
data="$out/data"
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
case "${1:-}" in
start)
  command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
  rm -rf "$out"; mkdir -p "$out/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres "$out"
  as_pg "$bin/initdb -D $data -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null"
  # fsync and autovacuum off: the counts are of the statements, not of the
  # disk or of background work that lands in whichever backend runs it.
  as_pg "nohup valgrind --tool=callgrind --callgrind-out-file=$out/cg.%p $bin/postgres -D $data -p $port \
    -c listen_addresses=127.0.0.1 -c unix_socket_directories=$out/sock -c fsync=off \
    -c synchronous_commit=off -c autovacuum=off -c max_connections=20 >$out/log 2>&1 &"
  for _ in $(seq 1 120); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 1; done
  pg_isready -h 127.0.0.1 -p "$port"
  ;;
stop)
  pid="$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  # Under valgrind the shutdown takes seconds; wait so that a start can follow.
  for _ in $(seq 1 120); do [ -e "$data/postmaster.pid" ] || break; sleep 1; done
  ;;
*)
  echo "usage: scripts/callgrind.sh start|stop"; exit 2
  ;;
esac
