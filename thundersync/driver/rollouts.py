"""One update's trajectories on the rollout side, each rerun from scratch if its worker dies.

A rerun gets a new trajectory id (`instance~aN#rep`) under the same theta_k; for OPD the failed
attempt's turns, already sent to the learner, are aborted first, so no part of it reaches the
update. A GRPO trajectory sends nothing before its reward, so its failure needs no abort.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from thundersync.bus.events import GroupRegistered, TrajectoryAborted
from thundersync.config import Objective, Schedule
from thundersync.driver.emit import SourceEmitter
from thundersync.driver.placement import RunFailed
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.rollout.agent_loop import AgentLoop, RolloutTask

if TYPE_CHECKING:
    from thundersync.driver.run import RunDriver

MAX_RERUNS = 3


async def run_trajectories(
    driver: RunDriver, update: int, plans: list[PlannedTrajectory], emitter: SourceEmitter
) -> None:
    cfg, side, bus = driver.cfg, driver.side, driver.bus
    assert side is not None
    sem = asyncio.Semaphore(cfg.rollout.concurrency)
    loop = AgentLoop(side.engine, side.chat, side.loop_cfg, callbacks=emitter, teacher=side.teacher)
    opd = cfg.objective is Objective.OPD

    async def one(plan: PlannedTrajectory) -> None:
        attempt, task, tid = 0, plan.task, plan.traj_id
        while True:
            try:
                async with sem:
                    task = driver.faults.rollout_task(tid, task, cfg.rollout.max_turns)
                    # fully_async: the engine may swap weights mid-trajectory; else pin theta_k
                    pinned = None if cfg.schedule is Schedule.FULLY_ASYNC else side.engine.version
                    await loop.arun([task], version=pinned)
                return
            except Exception as e:  # a rollout worker died: rerun from scratch under theta_k
                attempt += 1
                driver.files.write_log(f"trajectory {tid} failed ({e!r}); rerun #{attempt}")
                if attempt > MAX_RERUNS:
                    raise RunFailed(f"trajectory {tid} failed {attempt} times: {e}") from e
                if opd:  # drop the turns it already sent
                    bus.publish(
                        TrajectoryAborted(
                            run_id=driver.run_id,
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
                    bus.publish(
                        GroupRegistered(run_id=driver.run_id, update=update, group_id=tid, size=1)
                    )

    await asyncio.gather(*(one(p) for p in plans))
