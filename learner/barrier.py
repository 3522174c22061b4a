"""The barrier: close checks -> reduce across ranks -> normalise -> clip -> one AdamW step -> publish.

Exactly one optimizer step per update, and none while any source of the update is still open: a
failed rollout, a dead teacher or a killed learner can delay the step but never make it partial.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from thundersync.config import GroupReduction, Objective
from thundersync.learner.engine import GradientEngine
from thundersync.learner.parallel import ParallelContext, StepOptimizer


class BarrierError(RuntimeError):
    """The update cannot step yet; the message lists what is still open."""


class Publisher(Protocol):
    """Pushes theta_{version} to every rollout replica; returns the version they acknowledged."""

    def __call__(self, version: int, weights: dict[str, torch.Tensor]) -> int: ...


@dataclass(frozen=True)
class StepStats:
    version: int
    grad_norm: float
    clip_coef: float
    normaliser: float
    reduce_s: float
    step_s: float
    publish_s: float
    grad: torch.Tensor  # the normalised, pre-clip gradient (flat, master dtype), for equivalence


def barrier_step(
    engine: GradientEngine,
    *,
    objective: Objective,
    optimizer: StepOptimizer,
    ctx: ParallelContext,
    max_grad_norm: float,
    version: int,
    publish: Publisher | None,
    weights: dict[str, torch.Tensor] | None = None,
    group_reduction: GroupReduction = GroupReduction.SUM,
) -> StepStats:
    """GRPO: g_k = sum of the group directions (`mean`: divided by the number of groups;
    `token_mean`: by the update's scored tokens); OPD: the unnormalised sum over all turns
    divided by N_k, the update's scored tokens."""
    why = engine.open_sources()
    if why:
        raise BarrierError(
            f"refusing to step update {version}: "
            + "; ".join(why[:8])
            + (f" (+{len(why) - 8} more)" if len(why) > 8 else "")
            + ". Close every group/trajectory (or call close_batch and drain) before the barrier."
        )
    t0 = time.perf_counter()
    engine.pool.drop_free()  # the group buffers are done: their memory is the step's now
    counts = torch.tensor(
        [float(engine.acc.groups_closed), float(engine.acc.scored_tokens)], dtype=torch.float64
    )
    ctx.all_reduce_sum(counts)  # first: the normaliser is needed as the sum is reduced
    per_group = objective is Objective.GRPO and group_reduction is not GroupReduction.TOKEN_MEAN
    sources = float(counts[0] if per_group else counts[1])
    if sources <= 0:
        raise BarrierError(
            f"update {version} has nothing to learn from (no closed groups / scored tokens)"
        )
    summed = objective is Objective.GRPO and group_reduction is GroupReduction.SUM
    normaliser = 1.0 if summed else sources
    # -sum / normaliser in the master dtype, inside the accumulator's own storage; ranks > 1 sum
    # each float64 bucket over the ranks as it is read (no widened 8N vector)
    master = optimizer.step_dtype if optimizer.master else None
    reduce = ctx.reduce_bucket if ctx.distributed else None
    grad, norm = engine.acc.finish(normaliser, master, reduce, ctx.bucket_bytes // 8)
    t1 = time.perf_counter()
    if not math.isfinite(norm):
        raise BarrierError(f"update {version}: gradient norm is {norm}; the step was not taken")
    clip = min(1.0, max_grad_norm / (norm + 1e-6))
    step_grad = engine.acc.clipped(grad, clip)
    engine.pool.drop_free()  # what the step does not read is the optimizer's memory now
    optimizer.step(engine.spec.unflatten(step_grad))
    engine.acc.release_spare()
    engine.pool.drop_free()
    t2 = time.perf_counter()
    new_version = version + 1
    if publish is not None:
        acked = publish(new_version, weights or {})
        if acked != new_version:
            raise BarrierError(f"publish of version {new_version} was acknowledged as {acked}")
    t3 = time.perf_counter()
    return StepStats(new_version, norm, clip, normaliser, t1 - t0, t2 - t1, t3 - t2, grad)
