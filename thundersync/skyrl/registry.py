"""ThunderSync's exact estimators and loss as SkyRL registry entries, and SkyRL's names mapped
back onto the streaming learner.

A SkyRL config names `trainer.algorithm.advantage_estimator` and `policy_loss_type`; after
`register()` it can name ThunderSync's (`thundersync_grpo`, ...), which SkyRL's own trainer then
runs batch-wise. `learner_estimator` goes the other way: which streaming estimator reproduces a
SkyRL estimator exactly (SkyRL's `grpo` divides by the sample std, ThunderSync's `grpo` by the
population std as in the GRPO paper; `grpo_sample_std` is SkyRL's).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import numpy as np
import torch

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.config import Estimator
from thundersync.learner.objectives import advantages


class SkyRLName(StrEnum):
    """The names a SkyRL config uses for ThunderSync's entries."""

    GRPO = "thundersync_grpo"
    DR_GRPO = "thundersync_dr_grpo"
    RLOO = "thundersync_rloo"
    GRPO_SAMPLE_STD = "thundersync_grpo_sample_std"
    OPD = "thundersync_opd"  # per-token advantages = the token-level rewards log pi_T - log pi
    POLICY_GRADIENT = "thundersync_pg"  # the policy loss


_GROUP_ESTIMATORS = {
    SkyRLName.GRPO: Estimator.GRPO,
    SkyRLName.DR_GRPO: Estimator.DR_GRPO,
    SkyRLName.RLOO: Estimator.RLOO,
    SkyRLName.GRPO_SAMPLE_STD: Estimator.GRPO_SAMPLE_STD,
}


def learner_estimator(skyrl_name: str, *, grpo_norm_by_std: bool = True) -> Estimator:
    """The streaming estimator equal to SkyRL estimator `skyrl_name` (a group of >= 2 members)."""
    if skyrl_name in _GROUP_ESTIMATORS:
        return _GROUP_ESTIMATORS[SkyRLName(skyrl_name)]
    if skyrl_name == "grpo":
        return Estimator.GRPO_SAMPLE_STD if grpo_norm_by_std else Estimator.DR_GRPO
    if skyrl_name == "rloo":
        return Estimator.RLOO
    known = sorted({"grpo", "rloo", *_GROUP_ESTIMATORS})
    raise ValueError(
        f"trainer.algorithm.advantage_estimator={skyrl_name!r} has no exact streaming form: "
        f"use one of {', '.join(known)}"
    )


def _group_estimator(est: Estimator) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        epsilon: float = 1e-6,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SkyRL's estimator signature: one outcome reward per row, rows grouped by `index`."""
        scores = token_level_rewards.sum(dim=-1).tolist()
        rows: dict[Any, list[int]] = {}
        for i, key in enumerate(index.tolist() if isinstance(index, np.ndarray) else index):
            rows.setdefault(key, []).append(i)
        adv = [0.0] * len(scores)
        for members in rows.values():
            for i, a in zip(
                members, advantages(est, [scores[i] for i in members], epsilon), strict=True
            ):
                adv[i] = a
        out = torch.tensor(adv, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        out = out.unsqueeze(-1) * response_mask
        return out, out

    estimate.__name__ = f"thundersync_{est.value}"
    return estimate


def _opd_estimator(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPD: the trainer puts log pi_T(a_t) - log pi_theta(a_t) in the token-level rewards; that
    difference is the advantage of token t (no baseline, no normalisation)."""
    out = token_level_rewards * response_mask
    return out, out


def policy_gradient_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    config: Any,
    loss_mask: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-sum_t A_t * pi/pi_old over the mask: at the rollout's own weights (ThunderSync takes one
    exact step per batch, so pi = pi_old) its gradient is -sum_t A_t grad log pi, the gradient
    the streaming learner accumulates; no clip, because there is nothing stale to clip."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import reduce_loss

    ratio = torch.exp(log_probs - old_log_probs.detach())
    return reduce_loss(-advantages * ratio, loss_mask), {}


def register() -> None:
    """Add ThunderSync's entries to SkyRL's registries (idempotent)."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import (
        AdvantageEstimatorRegistry,
        PolicyLossRegistry,
    )

    have = set(AdvantageEstimatorRegistry.list_available())
    for name, est in _GROUP_ESTIMATORS.items():
        if name.value not in have:
            AdvantageEstimatorRegistry.register(name.value, _group_estimator(est))
    if SkyRLName.OPD.value not in have:
        AdvantageEstimatorRegistry.register(SkyRLName.OPD.value, _opd_estimator)
    if SkyRLName.POLICY_GRADIENT.value not in set(PolicyLossRegistry.list_available()):
        PolicyLossRegistry.register(SkyRLName.POLICY_GRADIENT.value, policy_gradient_loss)
