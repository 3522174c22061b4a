"""`rollout.on_failure: drop`: one update's dropped trajectories, told to the learner and counted.

A dropped trajectory leaves the update equal to sync training on the batch with its row masked
(docs/CONTRACTS.md, "Failed trajectories"). GRPO: a trajectory sends nothing before its reward,
so a failed member has nothing applied; if its group is not registered yet it registers with the
smaller size, else the learner is told (`TrajectoryAborted(dropped=True, index=i)`) and closes the
group over the others. A group left below the estimator's minimum (`min_group_size`, or its
configured size if smaller) is dropped whole: the learner forgets what it applied for it and the
emitter sends nothing more for it. OPD: the trajectory's turns already sent are removed
(`TrajectoryAborted(dropped=True)`), and N_k counts only the other trajectories' tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from thundersync.bus.events import TrajectoryAborted
from thundersync.bus.protocol import Bus
from thundersync.cluster.placement import RunFailed
from thundersync.config import Objective, RunConfig
from thundersync.driver.emit import SourceEmitter
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.learner.objectives import min_group_size


def failure_reason(e: BaseException) -> str:
    """A short reason (the key drops are counted by): the error's type and first line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:80]}" if text else type(e).__name__


@dataclass
class DropBook:
    """What `drop` did in one update: members lost per GRPO group, groups dropped whole, and the
    dropped trajectories counted by reason (the metrics line and the run log show them)."""

    objective: Objective
    group_size: int
    min_size: int
    lost: Counter[str] = field(default_factory=Counter)
    dead: set[str] = field(default_factory=set)
    reasons: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, cfg: RunConfig) -> DropBook:
        grpo = cfg.objective is Objective.GRPO
        size = cfg.rollout.group_size if grpo else 1
        return cls(cfg.objective, size, min(min_group_size(cfg.learner.estimator), size))

    def drop(
        self,
        *,
        bus: Bus,
        run_id: str,
        update: int,
        plan: PlannedTrajectory,
        traj_id: str,
        reason: str,
        emitter: SourceEmitter,
    ) -> str:
        """Drop `traj_id` (the failed attempt of `plan`); returns the run log's line."""
        self.reasons[reason] += 1
        gid = plan.group_id
        if self.objective is Objective.OPD:
            self.dead.add(traj_id)
            bus.publish(
                TrajectoryAborted(
                    run_id=run_id,
                    update=update,
                    traj_id=traj_id,
                    group_id=traj_id,
                    reason=reason,
                    dropped=True,
                )
            )
            return f"update {update}: trajectory {traj_id} dropped ({reason})"
        if gid in self.dead:
            return (
                f"update {update}: trajectory {traj_id} dropped ({reason}); group already dropped"
            )
        self.lost[gid] += 1
        left = self.group_size - self.lost[gid]
        whole = left < self.min_size
        if gid in emitter.registered:  # the learner has the group: it closes over the others
            bus.publish(
                TrajectoryAborted(
                    run_id=run_id,
                    update=update,
                    traj_id=traj_id,
                    group_id=gid,
                    reason=reason,
                    dropped=True,
                    index=plan.ref.repetition,
                )
            )
        else:  # it registers (if ever) with the members it has left
            emitter.group_sizes[gid] = left
        line = f"update {update}: trajectory {traj_id} dropped ({reason}); group {gid} "
        if whole:
            self.dead.add(gid)
            emitter.skipped.add(gid)
            return (
                line + f"dropped whole ({left} of {self.group_size} left, minimum {self.min_size})"
            )
        return line + f"keeps {left} of {self.group_size}"

    def check_some_left(self, update: int, groups: int) -> None:
        """Refuse an update every group of which was dropped: sync training on an empty batch
        has nothing to step with."""
        if groups and len(self.dead) >= groups:
            raise RunFailed(
                f"update {update}: every group was dropped after rollout failures "
                f"({dict(self.reasons)}); nothing is left to train on. Fix the failures, or set "
                "rollout.on_failure=rerun (rollout.max_tries) to retry them"
            )

    def metrics(self) -> dict[str, Any]:
        """The metrics line's drop fields (`drop_reasons` only when something was dropped)."""
        groups = len(self.dead) if self.objective is Objective.GRPO else 0
        out: dict[str, Any] = {
            "dropped_trajectories": sum(self.reasons.values()),
            "dropped_groups": groups,
        }
        if self.reasons:
            out["drop_reasons"] = dict(self.reasons)
        return out

    def summary(self, update: int) -> str | None:
        """The run log's line for the update (None when nothing was dropped)."""
        if not self.reasons:
            return None
        m = self.metrics()
        why = ", ".join(f"{r} x{n}" for r, n in self.reasons.most_common())
        return (
            f"update {update}: dropped {m['dropped_trajectories']} trajectories, "
            f"{m['dropped_groups']} groups whole ({why})"
        )
