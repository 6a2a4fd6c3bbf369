#!/usr/bin/env bash
# A pg_auto_failover formation on loopback for tests and for trying failover
# by hand: a monitor, a primary and a synchronous standby, run as ordinary
# processes (no systemd), all under one directory.
#
#   scripts/failover.sh install                      install postgresql-N-auto-failover
#   scripts/failover.sh up DIR MONITOR_PORT PORT1 PORT2
#   scripts/failover.sh dsn DIR                      the multi-host DSN of database test
#   scripts/failover.sh state DIR                    pg_autoctl show state
#   scripts/failover.sh switchover DIR               pg_autoctl perform switchover
#   scripts/failover.sh events DIR                   the monitor's event log (state changes)
#   scripts/failover.sh down DIR                     stop everything started by up
#
# pg_autoctl and PostgreSQL refuse to run as root: when run as root, this
# script runs them as the postgres user (runuser), and DIR must be writable by
# it. The tests use ports 6450-6469. Bringing the formation up takes about 45 s
# on a small machine, most of it the standby's base backup (a CHECKPOINT on the
# primary first keeps it from waiting for the next timed checkpoint).
set -euo pipefail

pgversion() {
  if [ -n "${PG_VERSION:-}" ]; then echo "$PG_VERSION"; return; fi
  ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1
}

install() {
  if command -v pg_autoctl >/dev/null 2>&1; then
    echo "pg_autoctl installed: $(pg_autoctl --version | head -n 1)"
    return
  fi
  local v
  v="$(pgversion)"
  [ -n "$v" ] || { echo "no PostgreSQL installed: run scripts/postgres.sh first"; exit 1; }
  echo "installing postgresql-$v-auto-failover from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "postgresql-$v-auto-failover"
  pg_autoctl --version | head -n 1
}

# prefix DIR: sets the array PREFIX to run a command as the service user with
# the formation's environment (its own pg_autoctl config and state dirs).
prefix() {
  local bin
  bin="/usr/lib/postgresql/$(pgversion)/bin"
  PREFIX=(env "PATH=$bin:$PATH" "XDG_CONFIG_HOME=$1/config" "XDG_DATA_HOME=$1/data")
  if [ "$(id -u)" = 0 ]; then PREFIX=(runuser -u postgres -- "${PREFIX[@]}"); fi
}

# as DIR CMD...: run CMD as the service user with the formation's environment.
as() {
  local PREFIX
  prefix "$1"; shift
  "${PREFIX[@]}" "$@"
}

# run DIR NAME: start "pg_autoctl run" for DIR/NAME in a process group of its
# own (setsid), its pid in DIR/NAME.pid, its log in DIR/NAME.log.
run() {
  local dir="$1" name="$2" PREFIX
  prefix "$dir"
  setsid "${PREFIX[@]}" pg_autoctl run --pgdata "$dir/$name" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

monitor_uri() { echo "postgres://autoctl_node@127.0.0.1:$(cat "$1/monitor.port")/pg_auto_failover?sslmode=disable"; }

# count DIR STATE: nodes whose reported and assigned state are both STATE.
count() {
  as "$1" psql "$(monitor_uri "$1")" -Atc \
    "SELECT count(*) FROM pgautofailover.node WHERE reportedstate = '$2' AND goalstate = '$2'" 2>/dev/null || echo 0
}

wait_for() { # DIR SECONDS WHAT: wait until one primary and one secondary
  local dir="$1" secs="$2" what="$3"
  for _ in $(seq 1 "$((secs * 2))"); do
    if [ "$(count "$dir" primary)" = 1 ] && [ "$(count "$dir" secondary)" = 1 ]; then return 0; fi
    sleep 0.5
  done
  echo "timed out after ${secs}s waiting for $what"; state "$dir" || true; exit 1
}

create_node() { # DIR NAME PORT
  local dir="$1" name="$2" port="$3"
  as "$dir" pg_autoctl create postgres --pgdata "$dir/$name" --pgport "$port" \
    --listen 127.0.0.1 --hostname 127.0.0.1 --name "$name" --dbname test \
    --monitor "$(monitor_uri "$dir")" --auth trust --no-ssl \
    >"$dir/$name-create.log" 2>&1 || { tail -n 30 "$dir/$name-create.log"; exit 1; }
  echo "$port" >"$dir/$name.port"
  run "$dir" "$name"
}

up() {
  local dir="$1" mport="$2" p1="$3" p2="$4"
  command -v pg_autoctl >/dev/null 2>&1 || { echo "pg_autoctl missing: scripts/failover.sh install"; exit 1; }
  mkdir -p "$dir"
  [ "$(id -u)" != 0 ] || chown postgres: "$dir"
  echo "$mport" >"$dir/monitor.port"
  as "$dir" pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$mport" \
    --listen 127.0.0.1 --hostname 127.0.0.1 --auth trust --no-ssl \
    >"$dir/monitor-create.log" 2>&1 || { tail -n 30 "$dir/monitor-create.log"; exit 1; }
  run "$dir" monitor
  for _ in $(seq 1 60); do
    as "$dir" pg_isready -q -h 127.0.0.1 -p "$mport" && break; sleep 0.5
  done

  create_node "$dir" node1 "$p1"
  for _ in $(seq 1 120); do
    [ "$(count "$dir" single)" = 1 ] && break; sleep 0.5
  done
  [ "$(count "$dir" single)" = 1 ] || { echo "node1 did not become primary"; state "$dir" || true; exit 1; }
  for _ in $(seq 1 60); do
    as "$dir" pg_isready -q -h 127.0.0.1 -p "$p1" && break; sleep 0.5
  done
  as "$dir" psql -h 127.0.0.1 -p "$p1" -d test -qc CHECKPOINT

  create_node "$dir" node2 "$p2"
  wait_for "$dir" 150 "the standby"
  dsn "$dir"
}

dsn() {
  echo "postgres://postgres@127.0.0.1:$(cat "$1/node1.port"),127.0.0.1:$(cat "$1/node2.port")/test?sslmode=disable&target_session_attrs=read-write"
}

state() { as "$1" pg_autoctl show state --pgdata "$1/monitor"; }

events() {
  as "$1" psql "$(monitor_uri "$1")" -Atc \
    "SELECT eventtime::time(3) || ' ' || nodename || ' ' || reportedstate || ' -> ' || goalstate || ': ' || description
     FROM pgautofailover.event ORDER BY eventid"
}

# A switchover is only lossless from a synchronous primary: wait until the
# primary is "primary" (not "wait_primary", where pg_auto_failover has turned
# synchronous replication off because it judged the standby unhealthy, which a
# loaded machine can make it do) and the standby "secondary".
switchover() {
  wait_for "$1" 60 "a primary with a synchronous standby before the switchover"
  as "$1" pg_autoctl perform switchover --pgdata "$1/node1" --wait 120 >"$1/switchover.log" 2>&1 ||
    { tail -n 30 "$1/switchover.log"; exit 1; }
  wait_for "$1" 60 "the switchover to settle"
}

down() {
  local dir="$1"
  [ -d "$dir" ] || return 0
  for name in node2 node1 monitor; do
    [ -f "$dir/$name.pid" ] || continue
    as "$dir" pg_autoctl stop --pgdata "$dir/$name" >/dev/null 2>&1 || true
  done
  for name in node2 node1 monitor; do
    [ -f "$dir/$name.pid" ] || continue
    local pid
    pid="$(cat "$dir/$name.pid")"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    # A postgres left over by a killed pg_autoctl.
    if [ -f "$dir/$name/postmaster.pid" ]; then
      local ppid
      ppid="$(head -n 1 "$dir/$name/postmaster.pid")"
      kill -QUIT "$ppid" 2>/dev/null || true
    fi
    rm -f "$dir/$name.pid"
  done
}

cmd="${1:-}"; shift || true
case "$cmd" in
  install) install ;;
  up) [ $# = 4 ] || { echo "usage: $0 up DIR MONITOR_PORT PORT1 PORT2"; exit 2; }; up "$@" ;;
  dsn|state|events|switchover|down) [ $# = 1 ] || { echo "usage: $0 $cmd DIR"; exit 2; }; "$cmd" "$1" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
