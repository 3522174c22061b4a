"""One update's trajectories on the rollout side, and what a failed one becomes.

`rollout.on_failure` (tries: `rollout.tries`): `rerun` runs a trajectory whose worker, sandbox or
engine failed again from scratch under the same theta_k with a new id (`instance~aN#rep`), and
fails the run once its tries are spent; `drop` reruns it while tries are left, then drops it from
its group (`driver.failures`: the update becomes sync training with that row masked); `fail`
fails the run at the first failure, before the update's step. For OPD a failed attempt's turns,
already sent to the learner, are aborted first, so no part of it reaches the update. A GRPO
trajectory sends nothing before its reward, so its failure needs no abort. A failure after every
event of the trajectory went out (e.g. closing its sandbox) changes nothing: it is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from thundersync.bus.events import TrajectoryAborted, TrajectoryRegistered
from thundersync.bus.protocol import Bus
from thundersync.cluster.placement import RunFailed
from thundersync.config import FailurePolicy, Objective, RunConfig, Schedule
from thundersync.driver.assemble import RolloutParts
from thundersync.driver.emit import SourceEmitter
from thundersync.driver.failures import DropBook, failure_reason
from thundersync.driver.faults import FaultPlan
from thundersync.driver.tasks import PlannedTrajectory
from thundersync.rollout.agent_loop import AgentLoop, RolloutTask


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
) -> DropBook:
    """Run the update's trajectories; returns what `drop` dropped (also in the tally)."""
    cfg, parts, bus = ctx.cfg, ctx.parts, ctx.bus
    sem = asyncio.Semaphore(cfg.rollout.concurrency)
    loop = AgentLoop(
        parts.engine, parts.chat, parts.loop_cfg, callbacks=emitter, teacher=parts.teacher
    )
    opd = cfg.objective is Objective.OPD
    policy, tries = cfg.rollout.on_failure, cfg.rollout.tries
    book = DropBook.of(cfg)

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
            except Exception as e:  # a rollout worker, its sandbox or the engine failed
                attempt += 1
                reason = failure_reason(e)
                if tid in emitter.sent:  # its data is complete and already in the update
                    ctx.log(f"trajectory {tid} failed after its data was sent ({e!r}); kept")
                    return
                if policy is FailurePolicy.FAIL:
                    raise RunFailed(
                        f"update {update}: trajectory {tid} failed ({reason}); "
                        "rollout.on_failure=fail stops the run before the update's step"
                    ) from e
                if attempt >= tries and policy is FailurePolicy.RERUN:
                    raise RunFailed(f"trajectory {tid} failed {attempt} times: {e}") from e
                if attempt >= tries:  # drop: no tries left
                    ctx.log(
                        book.drop(
                            bus=bus,
                            run_id=ctx.run_id,
                            update=update,
                            plan=plan,
                            traj_id=tid,
                            reason=reason,
                            emitter=emitter,
                        )
                    )
                    return
                ctx.log(f"trajectory {tid} failed ({e!r}); rerun #{attempt}")
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
    emitter.tally.drops = book.metrics()
    summary = book.summary(update)
    if summary is not None:
        ctx.log(summary)
    book.check_some_left(update, len({p.group_id for p in plans}))
    return book
