#!/usr/bin/env bash
# `make run`: the main job on the embedded default. Until the service lands this runs the learner
# equivalence demo on the tiny model; the control-plane issue replaces it with serve + dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/tsrl bench equivalence --objective grpo --updates 3
