"""SkyRL's `trainer.algorithm` (its own AlgorithmConfig) read as the streaming learner's
settings: exact where a streaming form exists, refused by field where none does."""

from __future__ import annotations

import pytest
from skyrl.train.config import AlgorithmConfig

from thundersync.config import Objective, load_run_config
from thundersync.skyrl.switch import SkyRLConfigError, learner_settings


def _algo(**kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(**{"use_kl_loss": False, "loss_reduction": "sequence_mean", **kw})


@pytest.mark.parametrize(
    ("skyrl", "want"),
    [
        ({}, "grpo_sample_std"),
        ({"grpo_norm_by_std": False}, "dr_grpo"),
        ({"advantage_estimator": "rloo"}, "rloo"),
        ({"advantage_estimator": "thundersync_grpo"}, "grpo"),
        ({"policy_loss_type": "dual_clip"}, "grpo_sample_std"),
    ],
)
def test_grpo_settings_map_to_the_exact_streaming_estimator(
    skyrl: dict[str, object], want: str
) -> None:
    learner = learner_settings(_algo(**skyrl), Objective.GRPO)
    cfg = load_run_config(data={"objective": "grpo", "learner": learner})
    assert cfg.learner.estimator.value == want
    assert cfg.learner.token_weighting == "seq_mean"
    assert cfg.learner.group_reduction.value == "mean"


def test_skyrl_default_token_mean_is_the_per_token_reduction() -> None:
    learner = learner_settings(_algo(loss_reduction="token_mean"), Objective.GRPO)
    cfg = load_run_config(data={"objective": "grpo", "learner": learner})
    assert cfg.learner.token_weighting == "token_sum"
    assert cfg.learner.group_reduction.value == "token_mean"


def test_opd_recipe_is_accepted() -> None:
    algo = _algo(
        advantage_estimator="thundersync_opd",
        policy_loss_type="importance_sampling",
        loss_reduction="token_mean",
    )
    assert learner_settings(algo, Objective.OPD) == {}


@pytest.mark.parametrize(
    ("skyrl", "field"),
    [
        ({"use_kl_loss": True}, "use_kl_loss"),  # SkyRL's default
        ({"loss_reduction": "prompt_mean"}, "loss_reduction"),
        ({"loss_reduction": "seq_mean_token_sum_norm"}, "loss_reduction"),
        ({"policy_loss_type": "gspo"}, "policy_loss_type"),
        ({"advantage_estimator": "gae"}, "advantage_estimator"),
        ({"advantage_batch_normalize": True}, "advantage_batch_normalize"),
        ({"zero_variance_filter": True}, "zero_variance_filter"),
        ({"use_entropy_loss": True}, "use_entropy_loss"),
    ],
)
def test_settings_without_an_exact_streaming_form_are_refused_by_field(
    skyrl: dict[str, object], field: str
) -> None:
    with pytest.raises(SkyRLConfigError, match=rf"trainer\.algorithm\.{field}=|{field}="):
        learner_settings(_algo(**skyrl), Objective.GRPO)
