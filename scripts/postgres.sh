#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth
# and a database named test, as the tests expect (see DEVELOPERS.md). Starts
# the installed cluster when it is down; installs one from Debian's packages
# when there is none. Does nothing when TEST_DATABASE_URL is set.
set -euo pipefail
if [ -n "${TEST_DATABASE_URL:-}" ]; then
  echo "using TEST_DATABASE_URL"; exit 0
fi
ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q postgresql
fi
version="$(ls /etc/postgresql | sort -V | tail -n 1)"
# A freshly installed cluster asks for passwords on TCP; the tests connect as
# postgres without one, as on the project's machines.
hba="/etc/postgresql/$version/main/pg_hba.conf"
if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
  sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  ready && pg_ctlcluster --skip-systemctl-redirect "$version" main reload
fi
if ! ready; then
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 60); do ready && break; sleep 1; done
fi
ready || { echo "PostgreSQL does not answer on 127.0.0.1:5432"; exit 1; }
if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
  psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test"
fi
psql -h 127.0.0.1 -U postgres -d test -tAc "SELECT 'PostgreSQL ' || current_setting('server_version') || ' ready'"
