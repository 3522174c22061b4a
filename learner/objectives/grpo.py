"""GRPO-family advantages as group-level affine maps of a trajectory's own reward.

Every estimator here writes A_i = alpha * (r_i - c) + beta with alpha, beta fixed by the group, so
  (1/m) sum_i A_i H_i = (alpha * G1 + beta * G2) / m,   G1 = sum (r_i - c) H_i,  G2 = sum H_i.
The shift c (the first reward bound in the group) keeps G1 - mu*G2 from cancelling
catastrophically when rewards sit far from zero (e.g. r ~ 1000): the learner only ever multiplies
H_i by r_i - c, which is O(spread), never by r_i itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tsrl.config import Estimator


@dataclass(frozen=True)
class GroupCoefficients:
    """g_G = (alpha * G1 + beta * G2) / m for accumulators built with shift c."""

    alpha: float
    beta: float
    m: int


def _stats(rewards: Sequence[float]) -> tuple[float, float]:
    # math.fsum: the group statistics are exact to double rounding whatever the arrival order.
    m = len(rewards)
    mu = math.fsum(rewards) / m
    var = math.fsum((r - mu) ** 2 for r in rewards) / m
    return mu, math.sqrt(var)


def _grpo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    mu, sigma = _stats(rewards)
    return 1.0 / (sigma + eps), -(mu - c) / (sigma + eps)


def _dr_grpo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    mu, _ = _stats(rewards)
    return 1.0, -(mu - c)


def _rloo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    m = len(rewards)
    if m < 2:
        raise ValueError("rloo needs at least 2 trajectories per group: raise rollout.group_size")
    mu, _ = _stats(rewards)
    k = m / (m - 1)
    return k, -k * (mu - c)


ESTIMATORS: dict[Estimator, Callable[[Sequence[float], float, float], tuple[float, float]]] = {
    Estimator.GRPO: _grpo,
    Estimator.DR_GRPO: _dr_grpo,
    Estimator.RLOO: _rloo,
}


def group_coefficients(
    estimator: Estimator | str, rewards: Sequence[float], *, shift: float, eps: float = 1e-6
) -> GroupCoefficients:
    """Coefficients that turn the shifted accumulators (G1, G2) into the group gradient."""
    est = Estimator(estimator)
    if not rewards:
        raise ValueError("a group needs at least one reward before it can close")
    alpha, beta = ESTIMATORS[est](rewards, shift, eps)
    return GroupCoefficients(alpha=alpha, beta=beta, m=len(rewards))


def advantages(
    estimator: Estimator | str, rewards: Sequence[float], eps: float = 1e-6
) -> list[float]:
    """Per-trajectory advantages, the textbook way (used by the batch-synchronous reference)."""
    est = Estimator(estimator)
    m = len(rewards)
    mu, sigma = _stats(rewards)
    if est is Estimator.GRPO:
        return [(r - mu) / (sigma + eps) for r in rewards]
    if est is Estimator.DR_GRPO:
        return [r - mu for r in rewards]
    if m < 2:
        raise ValueError("rloo needs at least 2 trajectories per group: raise rollout.group_size")
    return [r - (math.fsum(rewards) - r) / (m - 1) for r in rewards]
