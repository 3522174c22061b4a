#!/usr/bin/env bash
# The test command CI runs. pytest's exit code 5 ("no tests collected") is a failure here.
# The suite runs against a fresh, empty artefact cache (THUNDERSYNC_CACHE, see tsrl/cache.py), as
# on a new machine: a race that only a cold cache shows fails here, not on a user's first run.
# TSRL_TEST_CACHE=DIR reuses a cache of your choice instead (e.g. for quick local iterations).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TSRL_TEST_CACHE:-}" ]; then
  export THUNDERSYNC_CACHE=$TSRL_TEST_CACHE
else
  fresh=$(mktemp -d /tmp/tsrl-test-cache.XXXXXX)
  trap 'rm -rf "$fresh"' EXIT
  export THUNDERSYNC_CACHE=$fresh
fi
.venv/bin/python -m pytest -q -rs --durations=15 "$@" tests
rc=$?
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
