"""Write run directories (docs/CONTRACTS.md format) from simulated updates.

Used to test `tsrl predict` before measured stream runs exist: the simulator replays a workload
under a schedule, optionally with multiplicative noise on services and suffix (a second run of the
same workload never takes exactly the same time), and records learner spans and update lines as
the run driver would.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from thundersync.bench.simulator import SimSchedule, Update, WorkItem
from thundersync.rundir import RunFiles


def _noisy(u: Update, rng: np.random.Generator | None, noise: float) -> Update:
    if rng is None or noise <= 0:
        return u
    items = tuple(
        replace(it, service=it.service * float(1 + rng.uniform(-noise, noise))) for it in u.items
    )
    return replace(u, items=items, suffix=u.suffix * float(1 + rng.uniform(-noise, noise)))


def write_run(
    run_dir: str | Path,
    updates: list[Update],
    schedule: SimSchedule | str,
    *,
    t_start: float = 1_700_000_000.0,
    rng: np.random.Generator | None = None,
    noise: float = 0.0,
    first_update: int = 0,
) -> Path:
    """Simulate each update under `schedule` and write metrics.jsonl + spans.jsonl."""
    schedule = SimSchedule(schedule)
    files = RunFiles(run_dir)
    files.root.mkdir(parents=True, exist_ok=True)
    t0 = t_start
    with files.metrics.open("a") as mf, files.spans.open("a") as sf:
        for k, upd in enumerate(updates, start=first_update):
            u = _noisy(upd, rng, noise)
            free: dict[int, float] = {}
            busy = 0.0
            order = sorted(
                enumerate(u.items), key=lambda e: (e[1].release(schedule, u.rollout_close), e[0])
            )
            for j, it in order:
                start = max(it.release(schedule, u.rollout_close), free.get(it.rank, 0.0))
                free[it.rank] = start + it.service
                busy += it.service
                sf.write(json.dumps(_span(k, j, it, t0, start)) + "\n")
            R, P = u.rollout_close, u.suffix
            end_learn = max(R, max(free.values(), default=0.0))
            step = end_learn + P
            L = max(u.lane_loads(), default=0.0)
            rec = {
                "type": "update",
                "update": k,
                "schedule": str(schedule),
                "time": t0 + step,
                "step_s": step,
                "rollout_s": R,
                "learner_busy_s": L,
                "barrier_s": P,
                "idle_share": 1 - L / step,
                "mfu": 0.0,
                "reward_mean": 0.0,
                "tokens": 0,
            }
            mf.write(json.dumps(rec) + "\n")
            t0 += step
    return files.root


def _span(k: int, j: int, it: WorkItem, t0: float, start: float) -> dict[str, object]:
    return {
        "type": "span",
        "update": k,
        "role": "learner",
        "kind": "backward",
        "ids": {
            "source": f"u{k}-s{j}",
            "group": f"u{k}-g{it.group_close:.9f}",
            "rank": str(it.rank),
        },
        "start": t0 + start,
        "end": t0 + start + it.service,
        "ready": t0 + it.ready,
    }
