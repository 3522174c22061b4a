from __future__ import annotations

import random

import pytest
import torch

from thundersync.config import Estimator
from thundersync.learner.objectives import ESTIMATORS, advantages, group_coefficients


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_g1_g2_identity_holds_for_every_registered_estimator(
    estimator: Estimator, offset: float
) -> None:
    rng = random.Random(1)
    m, n = 6, 50
    rewards = [offset + rng.gauss(0, 1) for _ in range(m)]
    h = torch.randn(m, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    c = rewards[3]  # any reward can be the shift (the first to arrive)
    g1 = sum((r - c) * h[i] for i, r in enumerate(rewards))
    g2 = h.sum(0)
    coef = group_coefficients(estimator, rewards, shift=c)
    streamed = (coef.alpha * g1 + coef.beta * g2) / coef.m
    adv = advantages(estimator, rewards)
    textbook = sum(a * h[i] for i, a in enumerate(adv)) / m
    assert torch.allclose(streamed, textbook, rtol=1e-9, atol=1e-9)


def test_rloo_rejects_a_single_trajectory_group_with_the_fix() -> None:
    with pytest.raises(ValueError, match="group_size"):
        group_coefficients(Estimator.RLOO, [1.0], shift=1.0)


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@pytest.mark.parametrize("shift", [0.0, 1e6 + 0.3, -5.0])
@pytest.mark.parametrize("m", [1, 2, 3, 7])
def test_equal_rewards_give_exactly_zero_coefficients_for_any_fixed_shift(
    estimator: Estimator, shift: float, m: int
) -> None:
    """With c fixed before any reward (`learner.reward_shift`, `grpo_sum: float64`), c need not
    be one of the rewards: mean(r) - c of an equal-reward group at 1e6 + 0.3 is then off by an
    ulp, which 1/(sigma + eps) would blow up. The textbook advantages are exactly 0 (bar a lone
    grpo_sample_std member: r / (1 + eps)), so the coefficients must be too."""
    rewards = [1e6 + 0.3] * m
    if estimator is Estimator.RLOO and m < 2:
        return  # refused (test above)
    coef = group_coefficients(estimator, rewards, shift=shift)
    adv = advantages(estimator, rewards)
    if estimator is Estimator.GRPO_SAMPLE_STD and m == 1:
        assert adv == [rewards[0] / (1.0 + 1e-6)]
        assert coef.alpha * (rewards[0] - shift) + coef.beta == pytest.approx(adv[0], rel=1e-9)
        return
    assert adv == [0.0] * m
    assert (coef.alpha, coef.beta) == (0.0, 0.0)
