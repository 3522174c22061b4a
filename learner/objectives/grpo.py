"""GRPO-family advantages as group-level affine maps of a trajectory's own reward.

Every estimator here writes A_i = alpha * (r_i - c) + beta with alpha, beta fixed by the group, so
  (1/m) sum_i A_i H_i = (alpha * G1 + beta * G2) / m,   G1 = sum (r_i - c) H_i,  G2 = sum H_i.
The shift c keeps G1 - mu*G2 from cancelling catastrophically when rewards sit far from zero
(e.g. r ~ 1000): with c near the rewards the learner multiplies H_i by r_i - c, O(spread), never
by r_i itself. c is the group's first bound reward (`learner.grpo_sum: arrival`: best fp32
precision, but it depends on arrival order) or a value fixed before the run
(`learner.reward_shift`; 0 under `grpo_sum: float64`, whose float64 sums keep
|r - c| / spread * 1e-16, e.g. 1e-10 at r ~ 1e6, far below fp32's 6e-8). The group statistics are
taken on r_i - c too. A group whose rewards are all equal has every advantage exactly 0 under
every estimator (bar a lone `grpo_sample_std` member): its coefficients are exactly 0, whatever
c (with c far from the rewards, mean(r) - c carries an ulp that 1/(sigma + eps) blows up to ~1e-4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from thundersync.config import Estimator


@dataclass(frozen=True)
class GroupCoefficients:
    """g_G = (alpha * G1 + beta * G2) / m for accumulators built with shift c."""

    alpha: float
    beta: float
    m: int


def _stats(rewards: Sequence[float], c: float) -> tuple[float, float]:
    """(mean of r - c, population std), on the shifted rewards (see the module docstring).
    math.fsum: exact to double rounding whatever the arrival order."""
    d = [r - c for r in rewards]
    m = len(d)
    mu_d = math.fsum(d) / m
    var = math.fsum((x - mu_d) ** 2 for x in d) / m
    return mu_d, math.sqrt(var)


def _grpo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    mu_d, sigma = _stats(rewards, c)
    return 1.0 / (sigma + eps), -mu_d / (sigma + eps)


def _grpo_sample_std(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    """SkyRL's `grpo` estimator: (r - mean) / (sample std + eps); a group of one has mean 0 and
    std 1 there, so its member's advantage is r / (1 + eps) = ((r - c) + c) / (1 + eps)."""
    m = len(rewards)
    if m == 1:
        return 1.0 / (1.0 + eps), c / (1.0 + eps)
    mu_d, _ = _stats(rewards, c)
    s = math.sqrt(math.fsum((r - c - mu_d) ** 2 for r in rewards) / (m - 1))
    return 1.0 / (s + eps), -mu_d / (s + eps)


def _dr_grpo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    mu_d, _ = _stats(rewards, c)
    return 1.0, -mu_d


def _rloo(rewards: Sequence[float], c: float, eps: float) -> tuple[float, float]:
    m = len(rewards)
    if m < 2:
        raise ValueError("rloo needs at least 2 trajectories per group: raise rollout.group_size")
    mu_d, _ = _stats(rewards, c)
    k = m / (m - 1)
    return k, -k * mu_d


ESTIMATORS: dict[Estimator, Callable[[Sequence[float], float, float], tuple[float, float]]] = {
    Estimator.GRPO: _grpo,
    Estimator.DR_GRPO: _dr_grpo,
    Estimator.RLOO: _rloo,
    Estimator.GRPO_SAMPLE_STD: _grpo_sample_std,
}

# Fewest members a group that lost trajectories (`rollout.on_failure: drop`) may keep: each
# estimator's baseline is the group's own mean, so a lone member's advantage is 0 (rloo's is
# undefined) and it would only change `group_reduction: mean`'s count. Below it the group is
# dropped whole; a group configured smaller (`rollout.group_size: 1`) is never shrunk.
MIN_GROUP_SIZE: dict[Estimator, int] = {
    Estimator.GRPO: 2,
    Estimator.DR_GRPO: 2,
    Estimator.RLOO: 2,
    Estimator.GRPO_SAMPLE_STD: 2,
}


def min_group_size(estimator: Estimator | str) -> int:
    return MIN_GROUP_SIZE[Estimator(estimator)]


def group_coefficients(
    estimator: Estimator | str, rewards: Sequence[float], *, shift: float, eps: float = 1e-6
) -> GroupCoefficients:
    """Coefficients that turn the shifted accumulators (G1, G2) into the group gradient."""
    est = Estimator(estimator)
    if not rewards:
        raise ValueError("a group needs at least one reward before it can close")
    alpha, beta = ESTIMATORS[est](rewards, shift, eps)
    m = len(rewards)
    lone_raw = est is Estimator.GRPO_SAMPLE_STD and m == 1  # keeps its raw reward
    if not lone_raw and all(r == rewards[0] for r in rewards):
        return GroupCoefficients(alpha=0.0, beta=0.0, m=m)  # every advantage is exactly 0
    return GroupCoefficients(alpha=alpha, beta=beta, m=m)


def advantages(
    estimator: Estimator | str, rewards: Sequence[float], eps: float = 1e-6
) -> list[float]:
    """Per-trajectory advantages, the textbook way (used by the batch-synchronous reference),
    on rewards shifted by the first one (equal rewards give exactly 0 at any offset)."""
    est = Estimator(estimator)
    m = len(rewards)
    d = [r - rewards[0] for r in rewards] if rewards else []
    mu_d, sigma = _stats(rewards, rewards[0]) if rewards else (0.0, 0.0)
    if est is Estimator.GRPO:
        return [(x - mu_d) / (sigma + eps) for x in d]
    if est is Estimator.DR_GRPO:
        return [x - mu_d for x in d]
    if est is Estimator.GRPO_SAMPLE_STD:
        if m == 1:
            return [rewards[0] / (1.0 + eps)]
        s = math.sqrt(math.fsum((x - mu_d) ** 2 for x in d) / (m - 1))
        return [(x - mu_d) / (s + eps) for x in d]
    if m < 2:
        raise ValueError("rloo needs at least 2 trajectories per group: raise rollout.group_size")
    return [x - (math.fsum(d) - x) / (m - 1) for x in d]
