#!/usr/bin/env bash
# GPU smoke test for one GPU machine, under 10 minutes: the learner benchmarks on the accelerator.
#   bash deploy/gpu-smoke.sh [OUT_DIR]            (from the repository root, after `make setup`,
#                                                  or inside the learner image: TSRL=tsrl)
# Steps (each guarded: a missing command or flag is reported, never fatal for the others):
#   1. environment: nvidia-smi, torch.cuda
#   2. tsrl bench equivalence --objective grpo / opd in fp32, and in bf16 where the command has
#      --dtype (else the step is reported as skipped with the reason); --device cuda where it exists
#   3. tsrl bench speedup --json where that command exists
# Prints one JSON object (last line of stdout) and writes it to OUT_DIR/gpu-smoke.json:
#   {"ok": bool, "gpu": ..., "torch": ..., "cuda": bool, "steps": {name: {"rc", "seconds",
#    "result" (the step's last-line JSON or null), "note"}}}
# Exit 0 only when every step that ran succeeded and CUDA was available.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-out/gpu-smoke}}
mkdir -p "$OUT"
STEP_TIMEOUT=${STEP_TIMEOUT:-150}   # seconds per step; 5 steps max -> well under 10 minutes
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

has_cmd() {  # has_cmd WORDS...: is `tsrl WORDS --help` a registered command?
  "$TSRL" "$@" --help >/dev/null 2>&1
}
has_flag() {  # has_flag FLAG WORDS...
  local flag=$1; shift
  "$TSRL" "$@" --help 2>/dev/null | grep -q -- "$flag"
}

run_step() {  # run_step NAME NOTE ARGS...
  local name=$1 note=$2; shift 2
  local log=$OUT/$name.log start end rc
  echo "gpu-smoke: $name: $TSRL $*" >&2
  start=$(date +%s%N)
  timeout "$STEP_TIMEOUT" "$TSRL" "$@" > "$log" 2> "$OUT/$name.err"
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

# 2. equivalence, fp32 and bf16
if has_cmd bench equivalence; then
  DEV=()
  if has_flag --device bench equivalence; then DEV=(--device cuda); fi
  dev_note=""
  [ ${#DEV[@]} = 0 ] && dev_note="no --device flag: the bench picks its own device"
  for obj in grpo opd; do
    run_step "equivalence-$obj-fp32" "$dev_note" bench equivalence --objective "$obj" \
      --updates "$UPDATES" "${DEV[@]}" --json
    if has_flag --dtype bench equivalence; then
      run_step "equivalence-$obj-bf16" "$dev_note" bench equivalence --objective "$obj" \
        --updates "$UPDATES" --dtype bf16 "${DEV[@]}" --json
    else
      skip_step "equivalence-$obj-bf16" "tsrl bench equivalence has no --dtype flag (fp32 only)"
    fi
  done
else
  skip_step equivalence "tsrl bench equivalence is not a registered command"
fi

# 3. speedup
if has_cmd bench speedup; then
  run_step speedup "" bench speedup --json
else
  skip_step speedup "tsrl bench speedup is not a registered command"
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
