"""A stand-in run driver for the launcher's own tests: honours the run-directory contract of
docs/CONTRACTS.md (metrics.jsonl, spans.jsonl, log.txt, status.json, CANCEL -> exit 3) without
training anything, through the driver's own writer (`thundersync.rundir.RunDirWriter`). The acceptance
test uses the real `tsrl train`.

Behaviour from the config's `name`: "fail..." exits 1 without status.json; "slow..." sleeps 0.2 s
per update (cancel tests); "crash-after-status" writes status.json "failed" then exits 7; "staged..." reports a set-up stage
(`thundersync.stages`, as the real driver does) and holds there until cancelled; anything
else runs `updates` quick updates and succeeds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from thundersync import stages
from thundersync.rundir import RunDirWriter, RunStatus


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    name = str(config.get("name", ""))
    updates = int(config.get("updates", 1))
    print(f"fake driver: {name} with {updates} updates", flush=True)
    if name.startswith("fail"):
        print("boom: the stand-in driver failed on purpose", file=sys.stderr, flush=True)
        return 1
    rd = RunDirWriter(run_dir)
    try:
        return _run(rd, config, name, updates)
    finally:
        rd.close()


def _run(rd: RunDirWriter, config: dict[str, object], name: str, updates: int) -> int:
    if name.startswith("staged"):
        with stages.listening(rd.write_stage):
            stages.report("model", "converting SmolLM2-135M (GGUF to float32)", 3, 4)
        deadline = time.monotonic() + 120
        while not rd.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.05)
        rd.write_status(RunStatus.CANCELLED, "cancelled while converting the model")
        return 3
    for k in range(updates):
        t = time.time()
        if name.startswith("slow"):
            time.sleep(0.2)
        spans: list[dict[str, object]] = []
        for i, role in enumerate(("rollout", "tool", "teacher", "learner", "barrier")):
            span: dict[str, object] = {
                "type": "span",
                "update": k,
                "role": role,
                "kind": f"{role}-work",
                "ids": {"source": f"s{k}", "group": 0},
                "start": t + 0.01 * i,
                "end": t + 0.01 * i + 0.005,
            }
            if role == "learner":
                span["ready"] = t
            spans.append(span)
        rd.write_spans(spans)
        rd.write_update(
            {
                "update": k,
                "schedule": config.get("schedule", "stream"),
                "time": time.time(),
                "step_s": 0.05 + 0.01 * k,
                "rollout_s": 0.02,
                "learner_busy_s": 0.03,
                "barrier_s": 0.01,
                "idle_share": 0.25,
                "mfu": 0.01,
                "reward_mean": 0.1 * k,
                "tokens": 64,
            }
        )
        rd.write_log(f"update {k} done")
        print(f"update {k} done", flush=True)
        if rd.cancel_requested:
            rd.write_status(RunStatus.CANCELLED, f"cancelled after update {k}")
            return 3
    if name.startswith("crash-after-status"):
        rd.write_status(RunStatus.FAILED, "NaN loss at update 0")
        return 7
    rd.write_status(RunStatus.SUCCEEDED, f"{updates} updates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
