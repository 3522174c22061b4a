#!/usr/bin/env bash
# Idempotent set-up shared by `make run`, `make test` and CI.
# 1. system pieces (apt, services) from scripts/setup.d/*.sh, each idempotent;
# 2. the project venv (.venv) with the dev extras and SkyRL, re-installed only when pyproject.toml
#    or scripts/skyrl-requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
for part in scripts/setup.d/*.sh; do
  [ -e "$part" ] || continue
  bash "$part"
done
stamp=.venv/.setup-stamp
want=$(cat pyproject.toml scripts/skyrl-requirements.txt | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --upgrade pip
  # torch first, pinned: the CPU wheel on disk (an unpinned torch pulls a CUDA build).
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[dev]'
  # SkyRL (thundersync.skyrl): its pinned needs, then skyrl itself without its metadata's
  # Python / transformers bounds (see scripts/skyrl-requirements.txt)
  grep -v '^skyrl==' scripts/skyrl-requirements.txt | .venv/bin/pip install -q -r /dev/stdin torch==2.13.0
  .venv/bin/pip install -q --no-deps --ignore-requires-python \
    "$(grep '^skyrl==' scripts/skyrl-requirements.txt)"
  echo "$want" > "$stamp"
fi
