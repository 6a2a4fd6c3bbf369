#!/usr/bin/env bash
# Makes sure a MariaDB (or MySQL) server answers on 127.0.0.1:3306 as root
# with no password, with a database named test, as mysqlstore's tests expect
# (mysqlstore's tests, docs/mysql.md). Starts the installed server when it
# is down; installs MariaDB from Debian's packages when there is none. Does
# nothing when TEST_MYSQL_DSN is set.
set -euo pipefail
if [ -n "${TEST_MYSQL_DSN:-}" ]; then
  echo "using TEST_MYSQL_DSN"; exit 0
fi
client() { command -v mariadb >/dev/null 2>&1 && echo mariadb || echo mysql; }
ready() { "$(client)" --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null 2>&1; }
answers() { # the server answers, whatever it says to root over TCP
  "$(client)" --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' 2>&1 | grep -qv "Can't connect" ||
    "$(client)" -u root -e 'SELECT 1' >/dev/null 2>&1
}
if ready; then
  echo "a server answers on 127.0.0.1:3306"
else
  if [ ! -x /usr/sbin/mariadbd ]; then
    echo "installing MariaDB from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q mariadb-server mariadb-client
  fi
  # A package installed without a service manager may leave the data
  # directory or the socket directory to the first start.
  install -d -o mysql -g mysql /run/mysqld
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  if ! answers; then
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
  fi
  for _ in $(seq 1 60); do answers && break; sleep 1; done
  answers || { echo "MariaDB does not answer on 127.0.0.1:3306 (see /var/log/mysql/error.log)"; exit 1; }
fi
# A fresh install lets root in through the Unix socket only; the tests come
# over TCP without a password, as on the project's machines.
if ! ready; then
  "$(client)" -u root -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
fi
ready || { echo "root cannot log in over TCP without a password"; exit 1; }
"$(client)" --protocol=tcp -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
"$(client)" --protocol=tcp -h 127.0.0.1 -u root -N -e "SELECT CONCAT(VERSION(), ' ready')"
