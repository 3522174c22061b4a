"""SkyRL's `trainer.algorithm` read as the streaming learner's settings, or refused by field.

The streaming learner takes one exact step per batch at the rollout's own weights, so every
PPO-family loss of SkyRL's reduces to the policy gradient -sum_t A_t grad log pi there; what must
match is the estimator and the loss reduction. Settings with no exact streaming form are refused
with the SkyRL field that names them and the value to use, never approximated.
"""

from __future__ import annotations

from typing import Any

from thundersync.config import GroupReduction, Objective
from thundersync.skyrl.registry import SkyRLName, learner_estimator

# PPO-family losses whose gradient at pi = pi_old is the policy gradient (their clips are inactive
# at ratio 1); GSPO / SAPO / CISPO / clip_cov / kl_cov / DPPO / cross_entropy weight tokens
# differently or need stale log-probs.
ON_POLICY_LOSSES = frozenset(
    {"regular", "dual_clip", "importance_sampling", SkyRLName.POLICY_GRADIENT.value}
)
# SkyRL loss reductions the streaming learner reproduces exactly, per objective: its learner settings
GRPO_REDUCTIONS: dict[str, dict[str, str]] = {
    "sequence_mean": {"token_weighting": "seq_mean", "group_reduction": GroupReduction.MEAN.value},
    "token_mean": {
        "token_weighting": "token_sum",
        "group_reduction": GroupReduction.TOKEN_MEAN.value,
    },
}
OPD_REDUCTIONS: dict[str, dict[str, str]] = {"token_mean": {}}


class SkyRLConfigError(ValueError):
    """A SkyRL setting the streaming learner cannot reproduce exactly."""


def _get(algo: Any, name: str, default: Any = None) -> Any:
    return algo.get(name, default) if isinstance(algo, dict) else getattr(algo, name, default)


def _refuse(field: str, value: Any, fix: str) -> SkyRLConfigError:
    return SkyRLConfigError(f"trainer.algorithm.{field}={value!r}: {fix}")


def learner_settings(algo: Any, objective: Objective) -> dict[str, Any]:
    """The `learner` section equal to SkyRL `trainer.algorithm` `algo` (its AlgorithmConfig or a
    mapping) for `objective`."""
    loss = _get(algo, "policy_loss_type", "regular")
    if loss not in ON_POLICY_LOSSES:
        raise _refuse("policy_loss_type", loss, f"use one of {', '.join(sorted(ON_POLICY_LOSSES))}")
    for flag, fix in (
        ("use_kl_loss", "the streaming learner has no reference-KL loss: set it to false"),
        ("use_entropy_loss", "the streaming learner has no entropy bonus: set it to false"),
        ("advantage_batch_normalize", "batch-wide whitening waits for the whole batch: false"),
        ("zero_variance_filter", "it reshapes the batch after the rewards: set it to false"),
    ):
        if _get(algo, flag, False):
            raise _refuse(flag, True, fix)
    reduction = _get(algo, "loss_reduction", "token_mean")
    exact = GRPO_REDUCTIONS if objective is Objective.GRPO else OPD_REDUCTIONS
    if reduction not in exact:
        raise _refuse(
            "loss_reduction",
            reduction,
            f"{objective.value} streams exactly with {' or '.join(map(repr, exact))}: set one",
        )
    if objective is Objective.OPD:
        return {}
    est = _get(algo, "advantage_estimator", "grpo")
    try:
        estimator = learner_estimator(est, grpo_norm_by_std=_get(algo, "grpo_norm_by_std", True))
    except ValueError as e:
        raise SkyRLConfigError(str(e)) from None
    return {"estimator": estimator.value, **GRPO_REDUCTIONS[reduction]}
