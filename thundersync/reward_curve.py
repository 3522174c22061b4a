"""Reward against wall time from a run's metrics lines, and the time it takes to reach a target.

Shared by `tsrl bench time-to-target` (runs on this machine) and the service's
`/runs/{id}/time-to-target` (runs ingested from their metrics.jsonl): both read the same fields,
`update`, `time` (the moment the update's line was final), `step_s` and `reward_mean`.
Wall time is counted from the start of update 0 (`time - step_s` of the first line), so model
build and learner start-up, the same for every schedule, are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Point:
    update: int
    t: float  # seconds since the start of update 0
    reward: float
    staleness: int
    step_s: float
    grad_norm: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "update": self.update,
            "t": round(self.t, 3),
            "reward": self.reward,
            "staleness": self.staleness,
            "step_s": round(self.step_s, 3),
            "grad_norm": self.grad_norm,
        }


def curve(records: Iterable[Mapping[str, Any]]) -> list[Point]:
    """Metrics lines (any order) -> points by update, wall time from the start of update 0."""
    recs = sorted(records, key=lambda m: int(m["update"]))
    if not recs:
        return []
    t0 = float(recs[0]["time"]) - float(recs[0]["step_s"])
    return [
        Point(
            update=int(m["update"]),
            t=float(m["time"]) - t0,
            reward=float(m["reward_mean"]),
            staleness=int(m.get("max_staleness", 0)),
            step_s=float(m["step_s"]),
            grad_norm=float(m.get("grad_norm", 0.0)),
        )
        for m in recs
    ]


def time_to_target(points: list[Point], target: float) -> float | None:
    """Wall time of the first update whose mean reward reaches `target` (None: never)."""
    return next((p.t for p in points if p.reward >= target), None)


def update_to_target(points: list[Point], target: float) -> int | None:
    return next((p.update for p in points if p.reward >= target), None)


def reward_at(points: list[Point], budget_s: float) -> float | None:
    """Mean reward of the last update finished within `budget_s` (None: none had finished)."""
    done = [p for p in points if p.t <= budget_s]
    return done[-1].reward if done else None
