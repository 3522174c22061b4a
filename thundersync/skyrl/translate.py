"""A SkyRL run config (its `SkyRLTrainConfig`) as a ThunderSync run config.

What a SkyRL run means is kept: the policy, the optimiser, the prompts per step and samples per
prompt, the sampling settings, the dataset rows with their `env_class` and extras, the number
of steps (rows // train_batch_size per epoch, capped by max_training_steps) and, for the
distillation recipe, the reference model as the teacher. What has no exact streaming form is
refused naming the SkyRL field (see `switch`). SkyRL's placement, inference-engine and
FSDP / Megatron settings are not read: the run uses ThunderSync's engines and learner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thundersync.config import Objective, RunConfig, load_run_config
from thundersync.skyrl.dataset import SUFFIXES, read_rows
from thundersync.skyrl.registry import SkyRLName
from thundersync.skyrl.switch import SkyRLConfigError, learner_settings


def _objective(cfg: Any) -> Objective:
    if cfg.trainer.algorithm.advantage_estimator == SkyRLName.OPD.value:
        return Objective.OPD
    return Objective.GRPO


def _train_file(cfg: Any) -> Path:
    files = list(cfg.data.train_data)
    if len(files) != 1:
        raise SkyRLConfigError(
            f"data.train_data={files!r}: ThunderSync reads one dataset file; merge them into one"
        )
    path = Path(files[0])
    if path.suffix not in SUFFIXES or not path.is_file():
        raise SkyRLConfigError(
            f"data.train_data: {str(path)!r} is not a local {', '.join(SUFFIXES)} file"
        )
    return path


def _steps(cfg: Any, rows: int) -> int:
    per_epoch = rows // cfg.trainer.train_batch_size
    if per_epoch < 1:
        raise SkyRLConfigError(
            f"trainer.train_batch_size={cfg.trainer.train_batch_size}: the dataset has only "
            f"{rows} rows; lower it to at most {rows}"
        )
    steps = per_epoch * cfg.trainer.epochs
    cap = cfg.trainer.max_training_steps
    return min(steps, cap) if cap is not None else steps


def _one_step_per_batch(cfg: Any) -> None:
    t, opt = cfg.trainer, cfg.trainer.policy.optimizer_config
    if t.policy_mini_batch_size != t.train_batch_size:
        raise SkyRLConfigError(
            f"trainer.policy_mini_batch_size={t.policy_mini_batch_size}: ThunderSync takes one "
            f"exact step per batch; set it to trainer.train_batch_size ({t.train_batch_size})"
        )
    if t.update_epochs_per_batch != 1:
        raise SkyRLConfigError(
            f"trainer.update_epochs_per_batch={t.update_epochs_per_batch}: later epochs train "
            "on stale samples; set it to 1"
        )
    if opt.num_warmup_steps or opt.scheduler not in ("constant", "constant_with_warmup"):
        raise SkyRLConfigError(
            f"trainer.policy.optimizer_config.scheduler={opt.scheduler!r} with "
            f"num_warmup_steps={opt.num_warmup_steps}: ThunderSync keeps lr constant; use "
            "scheduler=constant_with_warmup and num_warmup_steps=0"
        )


def run_config_from_skyrl(cfg: Any, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The ThunderSync run that trains what SkyRL config `cfg` describes (`overrides`: dotted
    ThunderSync settings SkyRL has no field for, e.g. {'rollout.engine': 'vllm'}, applied last)."""
    objective = _objective(cfg)
    _one_step_per_batch(cfg)
    learner = learner_settings(cfg.trainer.algorithm, objective)
    data = _train_file(cfg)
    rows = read_rows(data)
    opt, gen = cfg.trainer.policy.optimizer_config, cfg.generator
    if cfg.trainer.policy.model.path is None:
        raise SkyRLConfigError("trainer.policy.model.path is not set: name the policy model")
    run: dict[str, Any] = {
        "name": cfg.trainer.run_name,
        "objective": objective.value,
        "updates": _steps(cfg, len(rows)),
        "seed": cfg.trainer.seed,
        "model": {"path": cfg.trainer.policy.model.path},
        "optim": {
            "lr": opt.lr,
            "weight_decay": opt.weight_decay,
            "beta1": opt.adam_betas[0],
            "beta2": opt.adam_betas[1],
            "max_grad_norm": opt.max_grad_norm,
        },
        "learner": learner,
        "rollout": {
            "group_size": gen.n_samples_per_prompt,
            "groups_per_update": cfg.trainer.train_batch_size,
            "max_turns": gen.max_turns,
            "max_new_tokens": gen.sampling_params.max_generate_length,
            "temperature": gen.sampling_params.temperature,
        },
        "env": {"name": "skyrl-dataset", "tasks": str(data.resolve())},
    }
    if objective is Objective.OPD:
        teacher = cfg.trainer.ref.model.path
        if teacher is None:
            raise SkyRLConfigError(
                "trainer.ref.model.path is not set: SkyRL's distillation recipe scores with the "
                "reference model; name the teacher there"
            )
        run["teacher"] = {"model": teacher}
    return load_run_config(None, overrides, data=run)
