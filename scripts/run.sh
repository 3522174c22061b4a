#!/usr/bin/env bash
# `make run`: the control plane on the embedded default (SQLite under runs/service, subprocess
# launcher). Prints a demo token and the dashboard URL, submits the demo recipe grpo-toy, and keeps
# serving until Ctrl-C (which stops the service and its driver cleanly).
# Settings: TSRL_PORT (default: first free port from 8000), TSRL_HOST, TSRL_DATA_DIR,
# TSRL_ADMIN_TOKEN (default: the demo token kept in $TSRL_DATA_DIR/demo-token), RECIPE (default
# grpo-toy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${TSRL_HOST:-127.0.0.1}
DATA=${TSRL_DATA_DIR:-runs/service}
RECIPE=${RECIPE:-grpo-toy}
PORT=${TSRL_PORT:-$($PY -c '
import socket
for port in range(8000, 8100):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break
')}
# The demo token is kept in the data folder (0600): a restart serves the same identity, so the
# dashboard and the API still list the earlier runs (a fresh token would revoke the old one).
mkdir -p "$DATA"
TOKEN_FILE=$DATA/demo-token
if [ -z "${TSRL_ADMIN_TOKEN:-}" ]; then
  if [ ! -s "$TOKEN_FILE" ]; then
    (umask 077; $PY -c 'import secrets; print("demo-" + secrets.token_urlsafe(16))' > "$TOKEN_FILE")
  fi
  chmod 600 "$TOKEN_FILE"
  TSRL_ADMIN_TOKEN=$(cat "$TOKEN_FILE")
fi
TOKEN=$TSRL_ADMIN_TOKEN
export TSRL_ADMIN_TOKEN

.venv/bin/tsrl serve --host "$HOST" --port "$PORT" --data-dir "$DATA" &
server=$!
stop() { trap - INT TERM EXIT; kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap stop INT TERM EXIT

BASE="http://$HOST:$PORT"
RUN_ID=$($PY -c '
import os, sys, time
import httpx
base, recipe = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 120
while True:
    try:
        if httpx.get(base + "/healthz", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the service did not answer on " + base + "/healthz within 120 s")
    time.sleep(0.3)
auth = {"Authorization": "Bearer " + os.environ["TSRL_ADMIN_TOKEN"]}
res = httpx.post(base + "/api/v1/runs", json={"recipe": recipe}, headers=auth, timeout=30)
if res.status_code != 201:
    sys.exit(f"submitting {recipe} failed: {res.status_code} {res.text}")
print(res.json()["id"])
' "$BASE" "$RECIPE")

printf '\n  ThunderSync is serving on %s  (SQLite + run directories under %s)\n\n' "$BASE" "$DATA"
printf '  demo token:  %s\n' "$TOKEN"
printf '  dashboard:   %s/#token=%s\n' "$BASE" "$TOKEN"
printf '  demo run:    %s -> %s/?token=%s#/runs/%s\n' "$RECIPE" "$BASE" "$TOKEN" "$RUN_ID"
printf '  API docs:    %s/docs\n' "$BASE"
printf '  try:         curl -H "Authorization: Bearer %s" %s/api/v1/runs/%s/updates\n\n' "$TOKEN" "$BASE" "$RUN_ID"
printf '  Ctrl-C stops the service (and the run'"'"'s driver).\n\n'
wait "$server"
