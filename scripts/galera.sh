#!/usr/bin/env bash
# A three-node MariaDB Galera cluster on loopback, as ordinary processes, for
# mysqlstore's multi-primary test (TestGalera in mysqlstore,
# docs/mysql.md):
#
#   scripts/galera.sh install     # galera-4, mariadb-server and rsync from Debian's packages, when missing
#   scripts/galera.sh start DIR   # three nodes, data under DIR; prints "node N PORT" per node once all are synced
#   scripts/galera.sh stop DIR    # stops them (the data stays under DIR)
#
# Each node has a --defaults-file of its own (DIR/nodeN/my.cnf) and free
# loopback ports for SQL, group communication, incremental and full state
# transfer. Node 1 bootstraps the cluster (--wsrep-new-cluster); nodes 2 and
# 3 join it one after the other and receive its state by rsync. root may log
# in over TCP from 127.0.0.1 without a password, as on the local server.
# Run as root: the nodes run as the mysql user, in directories handed to it.
set -euo pipefail
provider=/usr/lib/galera/libgalera_smm.so

install() {
  if [ -x /usr/sbin/mariadbd ] && [ -f "$provider" ] && command -v rsync >/dev/null; then
    echo "galera-4, MariaDB and rsync are installed"; return
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q galera-4 mariadb-server mariadb-client rsync
}

# free returns a TCP port in [$1, $1+1000) that nothing listens on.
free() {
  local p
  for p in $(shuf -i "$1-$(($1 + 999))" -n 200); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! grep -q ":$p\b" "$ports_taken" 2>/dev/null; then
      echo "$p" >>"$ports_taken"; echo "$p"; return
    fi
  done
  echo "no free port from $1" >&2; exit 1
}

client() { local dir=$1; shift; mariadb --no-defaults -S "$dir/mysqld.sock" -u root "$@"; }

node_cnf() { # node dir, sql port, gcomm port, ist port, sst port, cluster addresses
  cat >"$1/my.cnf" <<CNF
[mysqld]
user = mysql
datadir = $1/data
socket = $1/mysqld.sock
pid-file = $1/mysqld.pid
log-error = $1/error.log
port = $2
bind-address = 127.0.0.1
skip-name-resolve
innodb_buffer_pool_size = 32M
innodb_log_file_size = 16M
binlog_format = ROW
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $provider
wsrep_cluster_name = txlimit_galera
wsrep_cluster_address = gcomm://$6
wsrep_node_name = $(basename "$1")
wsrep_node_address = 127.0.0.1:$3
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$3;ist.recv_addr=127.0.0.1:$4;gcache.size=16M"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$5
CNF
}

wait_synced() { # node dir, seconds
  local i
  for i in $(seq 1 "$2"); do
    if [ "$(client "$1" -N -e "SHOW STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null | cut -f2)" = Synced ]; then
      return 0
    fi
    sleep 1
  done
  echo "$(basename "$1") did not reach Synced in $2 s; its log:" >&2
  tail -n 30 "$1/error.log" >&2 || true
  return 1
}

start() {
  local dir=$1
  mkdir -p "$dir"
  ports_taken="$dir/ports"
  : >"$ports_taken"
  local -a sql gcomm ist sst
  local n addrs=""
  for n in 1 2 3; do
    sql[n]=$(free 23000); gcomm[n]=$(free 24000); ist[n]=$(free 25000); sst[n]=$(free 26000)
    addrs="$addrs${addrs:+,}127.0.0.1:${gcomm[n]}"
  done
  for n in 1 2 3; do
    local nd="$dir/node$n"
    mkdir -p "$nd/data"
    node_cnf "$nd" "${sql[n]}" "${gcomm[n]}" "${ist[n]}" "${sst[n]}" "$addrs"
    chown -R mysql:mysql "$nd"
  done
  chmod 755 "$dir"
  mariadb-install-db --defaults-file="$dir/node1/my.cnf" --auth-root-authentication-method=normal >"$dir/node1/install.log" 2>&1
  for n in 1 2 3; do
    local extra=()
    [ "$n" = 1 ] && extra=(--wsrep-new-cluster)
    # The joiners start with an empty data directory: rsync brings node 1's.
    start-stop-daemon --start --background --pidfile "$dir/node$n/mysqld.pid" --exec /usr/sbin/mariadbd -- \
      --defaults-file="$dir/node$n/my.cnf" "${extra[@]}"
    wait_synced "$dir/node$n" 120
    if [ "$n" = 1 ]; then
      client "$dir/node1" -e "CREATE USER IF NOT EXISTS root@'127.0.0.1'; GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION"
    fi
  done
  for n in 1 2 3; do echo "node $n ${sql[n]}"; done
}

stop() {
  local dir=$1 n pid
  for n in 1 2 3; do
    if [ -f "$dir/node$n/mysqld.pid" ]; then
      pid=$(cat "$dir/node$n/mysqld.pid")
      kill "$pid" 2>/dev/null || true
    fi
  done
  for n in 1 2 3; do
    if [ -f "$dir/node$n/mysqld.pid" ]; then
      pid=$(cat "$dir/node$n/mysqld.pid")
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
}

case "${1:-}" in
  install) install ;;
  start) start "${2:?usage: galera.sh start DIR}" ;;
  stop) stop "${2:?usage: galera.sh stop DIR}" ;;
  *) echo "usage: galera.sh install | start DIR | stop DIR" >&2; exit 2 ;;
esac
