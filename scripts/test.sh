#!/usr/bin/env bash
# The test command CI runs. pytest's exit code 5 ("no tests collected") is a failure here.
# The suite runs against a fresh, empty artefact cache (TSRL_CACHE, see thundersync/cache.py), as
# on a new machine: a race that only a cold cache shows fails here, not on a user's first run.
# TSRL_TEST_CACHE=DIR reuses a cache of your choice instead (e.g. for quick local iterations).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TSRL_TEST_CACHE:-}" ]; then
  export TSRL_CACHE=$TSRL_TEST_CACHE
else
  fresh=$(mktemp -d /tmp/tsrl-test-cache.XXXXXX)
  trap 'rm -rf "$fresh"' EXIT
  export TSRL_CACHE=$fresh
fi
# 2 xdist workers (one per core; the suite alone leaves a core idle most of the time); the groups
# that must not run beside themselves are in tests/conftest.py. TSRL_TEST_WORKERS=0: one process.
workers=${TSRL_TEST_WORKERS:-2}
xdist=()
if [ "$workers" != 0 ]; then xdist=(-n "$workers"); fi
.venv/bin/python -m pytest -q -rs --durations=15 "${xdist[@]}" "$@" tests
rc=$?
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
