"""ThunderSync's estimators in SkyRL's registries, checked against SkyRL's own estimators.

SkyRL's `compute_grpo_outcome_advantage` / `compute_rloo_outcome_advantage` are the independent
implementation here: the streaming learner's group coefficients (alpha * (r - c) + beta) for the
estimator `learner_estimator` picks must give SkyRL's per-row advantages.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from skyrl.backends.skyrl_train.utils import ppo_utils

from thundersync.learner.objectives import group_coefficients
from thundersync.skyrl.registry import SkyRLName, learner_estimator, register


def _batch(rng: random.Random, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    rows = sum(sizes)
    t = 5
    rewards = torch.zeros(rows, t, dtype=torch.float64)
    mask = torch.zeros(rows, t, dtype=torch.float64)
    index = []
    r = 0
    for g, m in enumerate(sizes):
        for _ in range(m):
            n = rng.randint(1, t)
            mask[r, :n] = 1.0
            rewards[r, n - 1] = rng.choice([0.0, 1.0]) + rng.gauss(0, 0.4)
            index.append(f"p{g}")
            r += 1
    return rewards, mask, np.array(index, dtype=object)


def _streamed(est_name: str, rewards: torch.Tensor, index: np.ndarray, **kw: bool) -> torch.Tensor:
    """Per-row advantage as the streaming learner applies it: alpha * (r - c) + beta per group."""
    est = learner_estimator(est_name, **kw)
    scores = rewards.sum(-1).tolist()
    out = [0.0] * len(scores)
    for key in dict.fromkeys(index.tolist()):
        members = [i for i, k in enumerate(index.tolist()) if k == key]
        rs = [scores[i] for i in members]
        co = group_coefficients(est, rs, shift=rs[0], eps=1e-6)
        for i in members:
            out[i] = co.alpha * (scores[i] - rs[0]) + co.beta
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize(
    ("skyrl_estimator", "norm_by_std"), [("grpo", True), ("grpo", False), ("rloo", True)]
)
def test_streaming_coefficients_reproduce_skyrl_estimators(
    skyrl_estimator: str, norm_by_std: bool
) -> None:
    rng = random.Random(7)
    rewards, mask, index = _batch(rng, [4, 8, 3, 2, 5])
    fn = ppo_utils.AdvantageEstimatorRegistry.get(skyrl_estimator)
    theirs, _ = fn(
        token_level_rewards=rewards.clone(),
        response_mask=mask,
        index=index,
        grpo_norm_by_std=norm_by_std,
    )
    ours = _streamed(skyrl_estimator, rewards, index, grpo_norm_by_std=norm_by_std)
    assert torch.allclose(theirs[:, 0], ours, rtol=0, atol=1e-12), (theirs[:, 0], ours)


def test_group_of_one_matches_skyrl_grpo() -> None:
    """SkyRL's grpo gives a lone member its reward / (1 + eps); so does grpo_sample_std (SkyRL
    holds that group's std 1 in a float32 tensor, so 1 + eps is rounded to float32 there)."""
    rewards = torch.tensor([[0.0, 0.7]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    index = np.array(["only"], dtype=object)
    theirs, _ = ppo_utils.compute_grpo_outcome_advantage(
        token_level_rewards=rewards.clone(), response_mask=mask, index=index
    )
    ours = float(_streamed("grpo", rewards, index)[0])
    assert ours == pytest.approx(float(theirs[0, 0]), rel=1e-7)
    assert ours == pytest.approx(0.7 / (1 + 1e-6), rel=1e-15)


def test_registered_entries_run_through_skyrl() -> None:
    register()
    register()  # idempotent
    names = set(ppo_utils.AdvantageEstimatorRegistry.list_available())
    assert {n.value for n in SkyRLName if n is not SkyRLName.POLICY_GRADIENT} <= names
    assert SkyRLName.POLICY_GRADIENT.value in ppo_utils.PolicyLossRegistry.list_available()
    rng = random.Random(3)
    rewards, mask, index = _batch(rng, [4, 4, 6])

    def through_skyrl(name: str) -> torch.Tensor:
        adv, _ = ppo_utils.compute_advantages_and_returns(
            token_level_rewards=rewards.clone(),
            response_mask=mask,
            index=index,
            adv_estimator=name,
            config=None,
        )
        return adv

    theirs = through_skyrl("grpo")
    mine = through_skyrl(SkyRLName.GRPO_SAMPLE_STD.value)
    assert torch.allclose(mine, theirs, rtol=0, atol=1e-12)
    # ThunderSync's grpo (population std) is a different estimator: the two must differ
    pop = through_skyrl(SkyRLName.GRPO.value)
    assert not torch.allclose(pop, theirs, rtol=0, atol=1e-6)
    assert torch.equal(pop == 0, mask == 0)


def test_policy_gradient_loss_has_skyrl_regular_gradient_on_policy() -> None:
    """At pi = pi_old the ThunderSync loss and SkyRL's PPO loss have the same gradient (SkyRL
    takes exp(log pi - log pi_old) in float32 whatever the dtype: agreement to float32)."""
    register()
    from skyrl.train.config import AlgorithmConfig

    cfg = AlgorithmConfig(policy_loss_type="regular")
    torch.manual_seed(0)
    logits = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(3, 6, dtype=torch.float64)
    mask = (torch.rand(3, 6) > 0.3).double()
    grads = []
    for name in (SkyRLName.POLICY_GRADIENT.value, "regular"):
        lp = torch.nn.functional.logsigmoid(logits)
        loss, _ = ppo_utils.PolicyLossRegistry.get(name)(lp, lp.detach(), adv, cfg, mask)
        (g,) = torch.autograd.grad(loss, logits)
        grads.append(g)
    assert torch.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-12)
    assert grads[0].abs().sum() > 0


def test_unknown_skyrl_estimator_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"advantage_estimator='gae'.*use one of"):
        learner_estimator("gae")
