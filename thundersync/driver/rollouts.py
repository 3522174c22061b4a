"""One update's trajectories on the rollout side, each rerun from scratch if its worker dies.

A rerun gets a new trajectory id (`instance~aN#rep`) under the same theta_k; for OPD the failed
attempt's turns, already sent to the learner, are aborted first, so no part of it reaches the
update. A GRPO trajectory sends nothing before its reward, so its failure needs no abort.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from thundersync.bus.events import TrajectoryAborted, TrajectoryRegistered
from thundersync.bus.protocol import Bus
from thundersync.cluster.placement import RunFailed
from thundersync.config import Objective, RunConfig, Schedule
from thundersync.driver.assemble import RolloutParts
from thundersync.driver.emit import SourceEmitter
from thundersync.driver.faults import FaultPlan
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.rollout.agent_loop import AgentLoop, RolloutTask

MAX_RERUNS = 3


@dataclass(frozen=True)
class RolloutContext:
    """What an update's rollouts need of the run: its config, the parts they run with, the bus
    (aborts, reruns' registrations) under the run's id, the fault plan and the run log."""

    cfg: RunConfig
    parts: RolloutParts
    bus: Bus
    run_id: str
    faults: FaultPlan
    log: Callable[[str], None]


async def run_trajectories(
    ctx: RolloutContext, update: int, plans: list[PlannedTrajectory], emitter: SourceEmitter
) -> None:
    cfg, parts, bus = ctx.cfg, ctx.parts, ctx.bus
    sem = asyncio.Semaphore(cfg.rollout.concurrency)
    loop = AgentLoop(
        parts.engine, parts.chat, parts.loop_cfg, callbacks=emitter, teacher=parts.teacher
    )
    opd = cfg.objective is Objective.OPD

    async def one(plan: PlannedTrajectory) -> None:
        attempt, task, tid = 0, plan.task, plan.traj_id
        while True:
            try:
                async with sem:
                    task = ctx.faults.rollout_task(tid, task, cfg.rollout.max_turns)
                    # fully_async: the engine may swap weights mid-trajectory; else pin theta_k
                    pinned = None if cfg.schedule is Schedule.FULLY_ASYNC else parts.engine.version
                    await loop.arun([task], version=pinned)
                return
            except Exception as e:  # a rollout worker died: rerun from scratch under theta_k
                attempt += 1
                ctx.log(f"trajectory {tid} failed ({e!r}); rerun #{attempt}")
                if attempt > MAX_RERUNS:
                    raise RunFailed(f"trajectory {tid} failed {attempt} times: {e}") from e
                if opd:  # drop the turns it already sent
                    bus.publish(
                        TrajectoryAborted(
                            run_id=ctx.run_id,
                            update=update,
                            traj_id=tid,
                            group_id=tid,
                            reason=repr(e),
                        )
                    )
                base = plan.task
                task = RolloutTask(
                    f"{base.instance_id}~a{attempt}",
                    base.make_env,
                    base.prompt,
                    base.repetition,
                    base.seed,
                )
                tid = str(task.ref)
                emitter.plans[tid] = plan
                if opd:
                    bus.publish(TrajectoryRegistered(run_id=ctx.run_id, update=update, traj_id=tid))

    await asyncio.gather(*(one(p) for p in plans))
