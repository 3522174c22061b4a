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

from rollout.agent_loop import RolloutTask
from tsrl.config import Objective, RunConfig


@dataclass(frozen=True)
class TaskRef:
    """One task: the env factory arguments and a stable name."""

    name: str
    env_id: str
    extras: dict[str, Any]


def task_pool(cfg: RunConfig) -> list[TaskRef]:
    env = cfg.env.name
    if env in ("toy", "digits"):
        from driver.envs import DIGITS_ENV, register

        register()
        extras = {"tool_turns": cfg.rollout.max_turns - 1, "tool_seconds": cfg.env.tool_seconds}
        return [TaskRef(f"digits{i}", DIGITS_ENV, extras | {"seed": i}) for i in range(64)]
    if env in ("swe-smith", "swesmith"):
        import sandbox.envs  # noqa: F401  (registers the envs)
        from sandbox.envs.fixtures import SWESMITH_INSTANCES
        from sandbox.envs.swesmith import load_instances

        path = cfg.env.tasks or str(SWESMITH_INSTANCES)
        return [
            TaskRef(
                inst.instance_id,
                "thundersync-swesmith",
                {
                    "instance": inst.instance_id,
                    "instances_path": path,
                    "max_turns": cfg.rollout.max_turns,
                    "backend": cfg.env.sandbox,
                },
            )
            for inst in load_instances(path)
        ]
    if env in ("terminal", "seta", "harbor"):
        from pathlib import Path

        import sandbox.envs  # noqa: F401
        from sandbox.envs.fixtures import terminal_tasks

        dirs = (
            sorted(p for p in Path(cfg.env.tasks).iterdir() if p.is_dir())
            if cfg.env.tasks
            else terminal_tasks()
        )
        return [
            TaskRef(
                d.name,
                "thundersync-terminal",
                {"task": str(d), "max_turns": cfg.rollout.max_turns, "backend": cfg.env.sandbox},
            )
            for d in dirs
        ]
    raise ValueError(f"env.name {env!r} is unknown: use toy, swe-smith or terminal")


def _factory(ref: TaskRef, on_ray: bool = False) -> Callable[[], Any]:
    def make() -> Any:
        if on_ray:  # the environment and its sandbox live on a Ray worker
            from driver.ray_placement import RayEnv

            return RayEnv(ref.env_id, dict(ref.extras))
        import skyrl_gym

        return skyrl_gym.make(ref.env_id, extras=dict(ref.extras))

    return make


@dataclass(frozen=True)
class PlannedTrajectory:
    task: RolloutTask
    group_id: str  # GRPO: the group; OPD: the trajectory itself
    traj_id: str


def plan_update(
    cfg: RunConfig, pool: list[TaskRef], update: int, attempt: int = 0, on_ray: bool = False
) -> list[PlannedTrajectory]:
    rng = random.Random(cfg.seed * 100_003 + update)
    n_groups, m = cfg.rollout.groups_per_update, cfg.rollout.group_size
    refs = [pool[rng.randrange(len(pool))] for _ in range(n_groups)]
    plans = []
    for gi, ref in enumerate(refs):
        for j in range(m):
            instance = f"u{update}-g{gi}-{ref.name}"
            task = RolloutTask(
                instance,
                _factory(ref, on_ray),
                [],
                repetition=j,
                seed=cfg.seed * 7919 + update * 101 + gi,
            )
            traj = f"{instance}#{j}"
            group = instance if cfg.objective is Objective.GRPO else traj
            plans.append(PlannedTrajectory(task, group, traj))
    return plans
