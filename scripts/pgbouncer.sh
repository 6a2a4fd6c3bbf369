#!/usr/bin/env bash
# Installs PgBouncer from Debian's packages when it is missing. The tests
# (migrations.TestUpConcurrentThroughPgBouncer) start their own pgbouncer
# process with their own ini file on a port in 6440-6449; the package's own
# service is not used. .ci/run calls this script.
set -euo pipefail
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  echo "pgbouncer installed: $( (command -v pgbouncer || echo /usr/sbin/pgbouncer) )"
  exit 0
fi
echo "installing pgbouncer from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends pgbouncer
/usr/sbin/pgbouncer --version | head -n 1
