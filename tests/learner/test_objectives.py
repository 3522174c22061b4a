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
