"""What two busy cores cost each other on this machine, measured apart from any run.

Streaming overlaps the rollout core with the learner core. Even with perfect software both then
share what the hardware shares (caches, memory bandwidth, on a VM the host's scheduling), so each
side runs slower than it did alone under sync. This probe measures that floor without our code:
one fp32 MLP loop (the learner's and the engine's kind of work) pinned to each of the two cores,
first alone, then both at once. `slowdown[c]` = rate alone / rate together; `tsrl predict`
(`--contention-rollout/--contention-learner`) and the speedup bench take it as the contention a
prediction from a sync trace cannot see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

_LOOP = """
import json, os, sys, time, torch
cpu, seconds, hidden = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(hidden, 3 * hidden), torch.nn.SiLU(),
                        torch.nn.Linear(3 * hidden, hidden))
x = torch.randn(32, hidden)
with torch.no_grad():
    m(x)  # first-call warm-up
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        m(x)
        n += 1
print(json.dumps({"cpu": cpu, "rate": n / (time.perf_counter() - t)}))
"""


def _start(cpu: int, seconds: float, hidden: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _LOOP, str(cpu), str(seconds), str(hidden)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _rate(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"contention probe exited {proc.returncode}")
    return float(json.loads(out.strip().splitlines()[-1])["rate"])


def measure(seconds: float = 3.0, hidden: int = 1024) -> dict[str, Any]:
    """Slowdown of a pinned compute loop on each of the first two cores when both run at once."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return {"cores": cores, "slowdown": {}, "note": "fewer than 2 cores: nothing overlaps"}
    pair = cores[:2]
    alone = {c: _rate(_start(c, seconds, hidden)) for c in pair}
    procs = {c: _start(c, seconds, hidden) for c in pair}
    together = {c: _rate(p) for c, p in procs.items()}
    slowdown = {str(c): alone[c] / together[c] for c in pair}
    return {
        "cores": pair,
        "seconds": seconds,
        "rate_alone": {str(c): alone[c] for c in pair},
        "rate_together": {str(c): together[c] for c in pair},
        "slowdown": slowdown,
        "slowdown_mean": sum(slowdown.values()) / len(slowdown),
    }
