#!/usr/bin/env bash
# Makes sure a Redis server answers on 127.0.0.1:6379, for the benchmark's
# Redis subject and its test (cmd/txlimit-bench). Starts one when none
# answers; installs Debian's redis-server when there is none. Does nothing
# when TEST_REDIS_ADDR is set. The server it starts keeps nothing on disk.
set -euo pipefail
if [ -n "${TEST_REDIS_ADDR:-}" ]; then
  echo "using TEST_REDIS_ADDR"; exit 0
fi
ready() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing Redis from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q redis-server
fi
if ! ready; then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do ready && break; sleep 1; done
fi
ready || { echo "Redis does not answer on 127.0.0.1:6379 (see /var/log/redis/ci.log)"; exit 1; }
echo "$(redis-cli -h 127.0.0.1 -p 6379 info server | grep -m1 '^redis_version:' | tr -d '\r' | sed 's/redis_version:/Redis /') ready"
