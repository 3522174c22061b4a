#!/usr/bin/env bash
# The test command CI runs. pytest's exit code 5 ("no tests collected") is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -rs --durations=15 "$@" tests
rc=$?
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
