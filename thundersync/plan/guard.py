"""The plan against this machine, when a run starts: refuse before any rollout what cannot fit.

Why at the start: an OOM an hour in (the first barrier's fp64 all-reduce copy, the second open
group's accumulators) wastes the rollouts before it and says nothing about the knob to turn.
The check is arithmetic plus two reads (the GPU's total memory, the host's), so a CPU test run
pays nothing. Capacities, not what is free right now: the plan is a worst case, and comparing
it with a momentary free figure would refuse runs because of other processes.
Environment: TSRL_PLAN_HOST_GB / TSRL_PLAN_GPU_GB stand in for the machine's figures (a smaller
share of a shared machine, tests); TSRL_MEMORY_CHECK=0 skips the check.
"""

from __future__ import annotations

import os
from pathlib import Path

from thundersync.config import ConfigError, RunConfig
from thundersync.plan.advice import refuse
from thundersync.plan.memory import GB, Machine, MemoryPlan, gpus_needed, plan_memory
from thundersync.plan.shape import ModelShape, ShapeError, load_shape

ENV_HOST = "TSRL_PLAN_HOST_GB"
ENV_GPU = "TSRL_PLAN_GPU_GB"
ENV_OFF = "TSRL_MEMORY_CHECK"


class PlanRefused(ConfigError):
    """The run's memory plan does not fit this machine; the message names the knob."""


def _env_gb(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(float(raw) * GB)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: give a number of GB, e.g. {name}=64") from None


def _cgroup_limit() -> int | None:
    for p in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(p).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:  # "max" / a huge number: no limit
            return int(raw)
    return None


def host_memory_bytes() -> int:
    """This host's memory: MemTotal, or the cgroup's limit when lower (TSRL_PLAN_HOST_GB wins)."""
    forced = _env_gb(ENV_HOST)
    if forced is not None:
        return forced
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return min(total, limit) if limit else total


def gpu_memory_bytes(index: int) -> int:
    """GPU `index`'s total memory (no context is created; TSRL_PLAN_GPU_GB wins)."""
    forced = _env_gb(ENV_GPU)
    if forced is not None:
        return forced
    import torch

    return int(torch.cuda.get_device_properties(index).total_memory)


def machine_for(cfg: RunConfig, gpu_index: int | None) -> Machine:
    """This machine as the plan sees it: a CUDA learner on GPU `gpu_index`, else a CPU one."""
    if gpu_index is None:
        return Machine(0, None, host_memory_bytes())
    import torch

    # GPU counts are the placement checks' business (they know which GPUs the run may use)
    gpus = max(torch.cuda.device_count(), gpus_needed(cfg))
    return Machine(gpus, gpu_memory_bytes(gpu_index), host_memory_bytes())


def check_run_memory(
    cfg: RunConfig, model_dir: str | Path, gpu_index: int | None
) -> MemoryPlan | None:
    """Plan the run on this machine; raise `PlanRefused` naming the knob when it does not fit.
    None when the model's config.json has no shape the plan knows (nothing is refused then)."""
    try:
        shape: ModelShape = load_shape(Path(model_dir))
    except ShapeError:
        return None
    machine = machine_for(cfg, gpu_index)
    plan = plan_memory(cfg, shape, machine)
    if os.environ.get(ENV_OFF, "1") == "0":
        return plan
    why = refuse(plan, cfg)
    if why is not None:
        raise PlanRefused(
            f"{why}. Refused before any rollout (the plan: `tsrl plan`; "
            f"{ENV_OFF}=0 skips this check)"
        )
    return plan
