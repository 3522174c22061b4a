"""Which tasks an update runs: env name -> RolloutTasks (seeded by run seed and update index).

GRPO runs `groups_per_update` tasks, each `group_size` times (a group shares its prompt). OPD runs
`groups_per_update * group_size` independent trajectories. The same (seed, update) always gives the
same tasks, so a resumed run replays exactly what the interrupted one would have run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thundersync.config import Objective, RunConfig
from thundersync.rollout.agent_loop import RolloutTask
from thundersync.rollout.trajectory import TrajectoryRef
from thundersync.sandbox.envs.catalogue import TaskRef, tasks_for


def task_pool(cfg: RunConfig) -> list[TaskRef]:
    """The run's tasks: the `sandbox.envs.catalogue` entry of `cfg.env.name`."""
    return tasks_for(cfg)


def _factory(ref: TaskRef, on_ray: bool = False) -> Callable[[], Any]:
    def make() -> Any:
        if on_ray:  # the environment and its sandbox live on a Ray worker
            from thundersync.cluster.ray_actors import RayEnv

            return RayEnv(ref.env_id, dict(ref.extras))
        import skyrl_gym

        return skyrl_gym.make(ref.env_id, extras=dict(ref.extras))

    return make


@dataclass(frozen=True)
class PlannedTrajectory:
    task: RolloutTask
    group_id: str  # GRPO: the group; OPD: the trajectory itself

    @property
    def ref(self) -> TrajectoryRef:
        return self.task.ref

    @property
    def traj_id(self) -> str:
        return str(self.task.ref)


def plan_update(
    cfg: RunConfig, pool: list[TaskRef], update: int, on_ray: bool = False
) -> list[PlannedTrajectory]:
    rng = random.Random(cfg.seed * 100_003 + update)
    n_groups, m = cfg.rollout.groups_per_update, cfg.rollout.group_size
    picked = [pool[rng.randrange(len(pool))] for _ in range(n_groups)]
    plans = []
    for gi, ref in enumerate(picked):
        instance = f"u{update}-g{gi}-{ref.name}"
        for j in range(m):
            task = RolloutTask(
                instance,
                _factory(ref, on_ray),
                [dict(m) for m in ref.prompt],
                repetition=j,
                seed=cfg.seed * 7919 + update * 101 + gi,
            )
            group = instance if cfg.objective is Objective.GRPO else str(task.ref)
            plans.append(PlannedTrajectory(task, group))
    return plans
