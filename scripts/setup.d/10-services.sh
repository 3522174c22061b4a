#!/usr/bin/env bash
# Start PostgreSQL and Redis when they are not answering (this kind of machine starts them at boot).
set -uo pipefail
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
exit 0
