"""Discrete-event simulator of one update on the learner lanes (the release model of App. F).

Why a simulator: the speedup of streaming over batch-synchronous training depends only on *when*
each learner work item is released and how long it takes, so one update can be replayed exactly
from (release, service) pairs, without a model or a GPU.

Model of one update k (times relative to the update's start, seconds):
- work item j: objective ready time tau_j (trajectory rewarded / turn scored), the close time of
  its group, service p_j (its backward on a learner lane) and the rank that owns it;
- R: rollout close (last source ready), P: suffix (reduce + optimizer step + publish).
A schedule fixes the release time of each item:
  sync   -> R                 (the batch closes, then the learner starts)
  group  -> its group's close (release at group close)
  stream -> tau_j             (ThunderSync: release at source ready)
Each rank is one work-conserving FIFO lane in release order:
  c_j = max(release_j, c_{j-1}) + p_j,  c_0 = 0,   T_k = max(R, max over lanes c_n) + P.
Items are pinned to ranks (data-parallel shards) rather than list-scheduled, so each lane's
completion is monotone in the release times and stream <= group <= sync holds exactly (greedy
multi-lane list scheduling can show Graham anomalies where earlier release finishes later).
`async` (rollouts of k+1 on theta_k, one-step stale; for reference only, not lossless) is the
two-stage pipeline period max(R, L + P), with L the busiest lane's total service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class SimSchedule(StrEnum):
    SYNC = "sync"
    GROUP = "group"
    STREAM = "stream"
    ASYNC = "async"


@dataclass(frozen=True)
class WorkItem:
    ready: float  # objective ready time tau_j (s from update start)
    service: float  # learner busy time p_j (s)
    group_close: float  # close time of its group (>= ready)
    rank: int = 0

    def release(self, schedule: SimSchedule, rollout_close: float) -> float:
        if schedule == SimSchedule.STREAM:
            return self.ready
        if schedule == SimSchedule.GROUP:
            return self.group_close
        return rollout_close


@dataclass(frozen=True)
class Update:
    """One update's workload: its work items, rollout close R and suffix P."""

    items: tuple[WorkItem, ...]
    rollout_close: float  # R
    suffix: float  # P

    @property
    def ranks(self) -> int:
        return 1 + max((it.rank for it in self.items), default=0)

    def lane_loads(self) -> list[float]:
        loads = [0.0] * self.ranks
        for it in self.items:
            loads[it.rank] += it.service
        return loads

    @property
    def learner_busy(self) -> float:
        """L: the busiest lane's total service (all of it on one rank)."""
        return max(self.lane_loads(), default=0.0)


@dataclass(frozen=True)
class SimResult:
    schedule: SimSchedule
    step_s: float  # T_k
    lane_completion: float  # max over lanes of c_n (0 with no items)
    idle_share: float  # learner idle fraction of the step on the busiest lane


def lane_completion(releases: Sequence[float], services: Sequence[float]) -> float:
    """c_n of one FIFO lane: c_j = max(r_j, c_{j-1}) + p_j over items in release order."""
    c = 0.0
    for r, p in sorted(zip(releases, services, strict=True)):
        c = max(r, c) + p
    return c


def simulate(update: Update, schedule: SimSchedule | str) -> SimResult:
    schedule = SimSchedule(schedule)
    R, P = update.rollout_close, update.suffix
    L = update.learner_busy
    if schedule == SimSchedule.ASYNC:
        step = max(R, L + P)
        return SimResult(schedule, step, L, 1.0 - (L / step if step > 0 else 0.0))
    lanes: dict[int, tuple[list[float], list[float]]] = {}
    for it in update.items:
        rel, svc = lanes.setdefault(it.rank, ([], []))
        rel.append(it.release(schedule, R))
        svc.append(it.service)
    c = max((lane_completion(r, p) for r, p in lanes.values()), default=0.0)
    step = max(R, c) + P
    return SimResult(schedule, step, c, 1.0 - (L / step if step > 0 else 0.0))


def speedup(update: Update, schedule: SimSchedule | str = SimSchedule.STREAM) -> float:
    """T_sync / T_schedule for one update."""
    return simulate(update, SimSchedule.SYNC).step_s / simulate(update, schedule).step_s


def speedup_bound(R: float, L: float, P: float) -> float:
    """(R + L + P) / (max(R, L) + P): no release order can beat it (and it is <= 2)."""
    return (R + L + P) / (max(R, L) + P)
