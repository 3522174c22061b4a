#!/usr/bin/env bash
# GPU smoke test for one GPU machine, under 10 minutes: the learner's CUDA path for real.
#   bash deploy/gpu-smoke.sh [OUT_DIR]            (from the repository root, after `make setup`,
#                                                  or inside the learner image: TSRL=tsrl)
# Steps (each guarded and timed; a failing step never hides the others):
#   1. environment: nvidia-smi, torch.cuda (no CUDA: every step is skipped and ok is false; the
#      CPU benches are never run in its place)
#   2. gpu-tests: pytest tests/gpu (equivalence fp32 + bf16 on cuda, determinism, 0.5B memory;
#      vLLM on CUDA: generate, prompt log-probs, a shared-memory publish and its ack)
#   3. bench-gpu: `tsrl bench gpu --json` (the same checks as numbers: gaps, master/compute dtype,
#      determinism on/off, peak memory of sync vs stream on a ~0.5B config)
# Prints one JSON object (last line of stdout) and writes it to OUT_DIR/gpu-smoke.json:
#   {"ok": bool, "gpu": ..., "torch": ..., "cuda": bool, "steps": {name: {"rc", "seconds",
#    "result" (the step's last-line JSON or null), "note"}}}
# Exit 0 only when CUDA was available and every step succeeded.
# GPU_SMOKE_FORCE=1 runs the steps without CUDA (to test this script's plumbing on a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-out/gpu-smoke}}
mkdir -p "$OUT"
STEP_TIMEOUT=${STEP_TIMEOUT:-270}   # seconds per step; 2 steps -> under 10 minutes
UPDATES=${UPDATES:-4}

if [ -n "${TSRL:-}" ]; then :
elif [ -x .venv/bin/tsrl ]; then TSRL=.venv/bin/tsrl
elif command -v tsrl >/dev/null 2>&1; then TSRL=tsrl
else
  echo "gpu-smoke: no tsrl command: run 'make setup' (or set TSRL=/path/to/tsrl)" >&2
  exit 2
fi
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3 || command -v python); fi
STEPS=$OUT/steps.jsonl
: > "$STEPS"

record() {  # record NAME RC SECONDS LOGFILE NOTE
  "$PY" - "$@" >> "$STEPS" <<'EOF'
import json, sys
name, rc, secs, log, note = sys.argv[1:6]
result = None
try:
    lines = [l for l in open(log, errors="replace").read().splitlines() if l.strip()]
except FileNotFoundError:
    lines = []
for line in reversed(lines):
    try:
        result = json.loads(line)
        break
    except ValueError:
        continue
print(json.dumps({"name": name, "rc": int(rc), "seconds": float(secs), "result": result,
                  "note": note or None}))
EOF
}

run_step() {  # run_step NAME NOTE COMMAND...
  local name=$1 note=$2; shift 2
  local log=$OUT/$name.log start end rc
  echo "gpu-smoke: $name: $*" >&2
  start=$(date +%s%N)
  timeout "$STEP_TIMEOUT" "$@" > "$log" 2> "$OUT/$name.err"
  rc=$?
  end=$(date +%s%N)
  [ "$rc" = 124 ] && note="${note:+$note; }timed out after ${STEP_TIMEOUT}s"
  [ "$rc" != 0 ] && tail -n 20 "$OUT/$name.err" >&2
  record "$name" "$rc" "$(( (end - start) / 1000000 ))e-3" "$log" "$note"
}

skip_step() {  # skip_step NAME REASON
  echo "gpu-smoke: $1 skipped: $2" >&2
  record "$1" -1 0 /dev/null "skipped: $2"
}

# 1. environment
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || echo "gpu-smoke: nvidia-smi missing or no GPU visible" >&2
TORCH_INFO=$("$PY" -c 'import json, torch; print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(), "cuda_version": torch.version.cuda}))' 2>/dev/null || echo '{"torch": null, "cuda": false}')
echo "gpu-smoke: gpu=${GPU:-none} $TORCH_INFO" >&2
CUDA=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1]).get("cuda"))' "$TORCH_INFO")

if [ "$CUDA" = True ] || [ "${GPU_SMOKE_FORCE:-0}" = 1 ]; then
  # 2. the CUDA tests (they skip themselves without CUDA: then nothing was checked)
  # shellcheck disable=SC2086  # PYTEST may be a command with arguments
  run_step gpu-tests "" ${PYTEST:-$PY -m pytest} -q -rs tests/gpu
  # 3. the same checks as numbers
  run_step bench-gpu "" "$TSRL" bench gpu --device cuda --updates "$UPDATES" --json
else
  skip_step gpu-tests "torch sees no CUDA device"
  skip_step bench-gpu "torch sees no CUDA device"
fi

"$PY" - "$STEPS" "$GPU" "$TORCH_INFO" "$OUT/gpu-smoke.json" <<'EOF'
import json, sys
steps_path, gpu, torch_info, out = sys.argv[1:5]
steps = [json.loads(l) for l in open(steps_path) if l.strip()]
info = json.loads(torch_info)
ran = [s for s in steps if s["rc"] != -1]
ok = bool(info.get("cuda")) and bool(ran) and all(s["rc"] == 0 for s in ran)
doc = {"ok": ok, "gpu": gpu or None, **info,
       "steps": {s.pop("name"): s for s in steps}}
text = json.dumps(doc)
open(out, "w").write(text + "\n")
print(text)
sys.exit(0 if ok else 1)
EOF
