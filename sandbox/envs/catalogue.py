"""The task catalogue: `env.name` (a `thundersync.config.EnvName`) -> the run's task list.

Every entry is a function `RunConfig -> list[TaskRef]`; a `TaskRef` is what the driver needs to
make one env (`skyrl_gym.make(ref.env_id, extras=ref.extras)`) and a stable task name. Every
task's extras carry `backend` (from `env.sandbox`) and `pool_size` (`rollout.concurrency`, so the
process-wide session pool is at least that big, see `sandbox.envs.base`).

- toy        64 `tsrl-digits` tasks (seed i), `rollout.max_turns - 1` sandbox tool turns of
             `env.tool_seconds` each
- swe-smith  one `tsrl-swesmith` task per record of `env.tasks` (default: the fixtures)
- terminal   one `tsrl-terminal` task per task directory under `env.tasks` (a path,
             or a built-in set: `terminal-easy`; default: the fixtures, on the local backend
             without those whose Dockerfile adds to the image, which only the docker backend
             builds: `sandbox.images.local_gap`); `env.examples` go to every task's prompt,
             `env.reward_key` (the reward.json key trained on) to every task's verifier
Config validation already rejects an unknown `env.name`; a name without an entry here is a bug
(the test suite checks every `EnvName` has one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thundersync.config import BUILTIN_TASK_SETS, EnvName
from thundersync.sandbox.envs import EnvId

if TYPE_CHECKING:
    from thundersync.config import RunConfig


@dataclass(frozen=True)
class TaskRef:
    """One task: the env factory arguments and a stable name."""

    name: str
    env_id: str
    extras: dict[str, Any]
    prompt: tuple[dict[str, Any], ...] = ()  # initial messages; empty: the env writes them


def _sandbox_extras(cfg: RunConfig) -> dict[str, Any]:
    return {"backend": cfg.env.sandbox, "pool_size": cfg.rollout.concurrency}


def _agent_extras(cfg: RunConfig) -> dict[str, Any]:
    """The run's settings for an agent env: sandbox, turn budget, worked examples."""
    extras = _sandbox_extras(cfg) | {"max_turns": cfg.rollout.max_turns}
    if cfg.env.examples:  # plain dicts: extras cross to Ray workers
        extras["examples"] = [e.model_dump() for e in cfg.env.examples]
    return extras


def toy_tasks(cfg: RunConfig) -> list[TaskRef]:
    extras = _sandbox_extras(cfg) | {
        "tool_turns": cfg.rollout.max_turns - 1,
        "tool_seconds": cfg.env.tool_seconds,
    }
    return [TaskRef(f"digits{i}", EnvId.DIGITS.value, extras | {"seed": i}) for i in range(64)]


def swe_smith_tasks(cfg: RunConfig) -> list[TaskRef]:
    from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES
    from thundersync.sandbox.envs.swesmith import load_instances

    path = cfg.env.tasks or str(SWESMITH_INSTANCES)
    extras = _sandbox_extras(cfg) | {"instances_path": path, "max_turns": cfg.rollout.max_turns}
    return [
        TaskRef(inst.instance_id, EnvId.SWESMITH.value, extras | {"instance": inst.instance_id})
        for inst in load_instances(path)
    ]


def terminal_tasks(cfg: RunConfig) -> list[TaskRef]:
    from thundersync.sandbox.envs import fixtures
    from thundersync.sandbox.envs.terminal import load_task
    from thundersync.sandbox.images import local_gap

    if cfg.env.tasks in BUILTIN_TASK_SETS:
        dirs = fixtures.terminal_tasks(fixtures.builtin_task_dir(cfg.env.tasks))
    elif cfg.env.tasks:
        dirs = sorted(p for p in Path(cfg.env.tasks).iterdir() if p.is_dir())
    else:  # a local run cannot solve a fixture that needs its built image: leave those out
        dirs = fixtures.terminal_tasks()
        if str(cfg.env.sandbox) == "local":
            dirs = [d for d in dirs if not local_gap(load_task(d).dockerfile)]
    extras = _agent_extras(cfg)
    if cfg.env.reward_key is not None:  # the recipe's choice wins over task.toml's
        extras["reward_key"] = cfg.env.reward_key
    return [TaskRef(d.name, EnvId.TERMINAL.value, extras | {"task": str(d)}) for d in dirs]


def skyrl_dataset_tasks(cfg: RunConfig) -> list[TaskRef]:
    """Each row of the SkyRL dataset file `env.tasks` (thundersync.skyrl.dataset)."""
    from thundersync.skyrl.dataset import dataset_tasks

    return dataset_tasks(str(cfg.env.tasks), _agent_extras(cfg), confined=cfg.env.dataset_confined)


CATALOGUE: dict[EnvName, Callable[[RunConfig], list[TaskRef]]] = {
    EnvName.TOY: toy_tasks,
    EnvName.SWE_SMITH: swe_smith_tasks,
    EnvName.TERMINAL: terminal_tasks,
    EnvName.SKYRL_DATASET: skyrl_dataset_tasks,
}


def tasks_for(cfg: RunConfig) -> list[TaskRef]:
    """The task list of `cfg.env.name` (the envs' ids are registered by importing this)."""
    return CATALOGUE[EnvName(cfg.env.name)](cfg)
