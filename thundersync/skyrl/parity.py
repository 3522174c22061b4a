"""The streaming learner against SkyRL's own batch loss on the same batches (`tsrl bench skyrl`).

SkyRL's side runs what one data-parallel rank of its trainer runs on a batch, with its own
functions: `compute_advantages_and_returns` (the SkyRL estimator by name),
`apply_loss_reduction_to_advantages_minibatch` (one mini-batch), the registered policy loss at
pi = pi_old, one backward, its global-norm clip and AdamW. OPD is SkyRL's on-policy distillation
recipe: per-token reward -KL_k1(student, teacher) from its `compute_approx_kl`, advantages equal
to that reward, `importance_sampling` loss, `token_mean`. ThunderSync's side replays the same
batch source by source through the streaming engine, in arrival order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import thundersync.skyrl  # noqa: F401  (prepares the interpreter before skyrl is imported)
from thundersync.config import Objective, RunConfig, Schedule, load_run_config
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.parallel import adamw
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn
from thundersync.skyrl.registry import SkyRLName, register
from thundersync.skyrl.switch import learner_settings


@dataclass(frozen=True)
class SkyRLAlgorithm:
    """The SkyRL `trainer.algorithm` settings a parity run uses, per objective."""

    advantage_estimator: str
    policy_loss_type: str
    loss_reduction: str

    @staticmethod
    def for_objective(
        objective: Objective, policy_loss: str | None = None, loss_reduction: str | None = None
    ) -> SkyRLAlgorithm:
        """SkyRL's defaults for GRPO (`regular` PPO loss; at pi = pi_old every PPO-family loss
        has the same gradient, but `regular` takes its ratio in float32 whatever the dtype, so
        a float64 check names `importance_sampling`) and its OPD recipe."""
        if objective is Objective.GRPO:
            return SkyRLAlgorithm(
                "grpo", policy_loss or "regular", loss_reduction or "sequence_mean"
            )
        return SkyRLAlgorithm(
            SkyRLName.OPD.value, policy_loss or "importance_sampling", "token_mean"
        )

    def config(self) -> Any:
        from skyrl.train.config import AlgorithmConfig

        return AlgorithmConfig(
            advantage_estimator=self.advantage_estimator,
            policy_loss_type=self.policy_loss_type,
            loss_reduction=self.loss_reduction,
            use_kl_loss=False,
        )


def _logprobs(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """log pi(ids[t+1] | ids[:t+1]) for every position of one unpadded sequence."""
    x = torch.tensor(ids).view(1, -1)
    logits = model(input_ids=x).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:].view(-1, 1))[:, 0]


def _rows(model: nn.Module, batch: LoggedBatch) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Per row: log-probs of its scored span and its loss mask (GRPO: a group member's response;
    OPD: a trajectory's turns after the first token)."""
    items = [it for _, it in batch.events]
    lps, masks = [], []
    if batch.objective is Objective.GRPO:
        for g in batch.groups:
            content = {
                it.index: it
                for it in items
                if isinstance(it, GrpoContent) and it.group_id == g.group_id
            }
            for i in range(g.size):
                resp = content[i]
                lp = _logprobs(model, [*g.prompt_ids, *resp.response_ids])
                lps.append(lp[len(g.prompt_ids) - 1 :])
                masks.append(list(resp.response_mask))
        return lps, masks
    for tid in batch.trajectories:
        turns = sorted(
            (it for it in items if isinstance(it, OpdTurn) and it.traj_id == tid),
            key=lambda t: t.turn,
        )
        lps.append(_logprobs(model, [x for t in turns for x in t.token_ids]))
        masks.append([m for t in turns for m in t.action_mask][1:])
    return lps, masks


def _pad(
    rows: list[torch.Tensor] | list[list[int]], width: int, dtype: torch.dtype
) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, r in enumerate(rows):
        t = r if isinstance(r, torch.Tensor) else torch.tensor(r, dtype=dtype)
        out[i, : len(t)] = t
    return out


def skyrl_batch_loss(model: nn.Module, batch: LoggedBatch, algo: SkyRLAlgorithm) -> torch.Tensor:
    """The loss SkyRL's trainer backpropagates for `batch` on one rank (see the module doc)."""
    from skyrl.backends.skyrl_train.utils import ppo_utils

    register()
    cfg = algo.config()
    lp_rows, mask_rows = _rows(model, batch)
    width = max(len(r) for r in lp_rows)
    lp = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in lp_rows])
    loss_mask = _pad(mask_rows, width, lp.dtype)
    items = [it for _, it in batch.events]
    if batch.objective is Objective.GRPO:
        response_mask = _pad([[1] * len(m) for m in mask_rows], width, torch.float32)
        # SkyRL keeps rewards in float32; a float64 run keeps them in float64 end to end
        rewards = torch.zeros(
            len(lp_rows), width, dtype=torch.promote_types(lp.dtype, torch.float32)
        )
        index = []
        r = 0
        for g in batch.groups:
            by_index = {
                it.index: it.reward
                for it in items
                if isinstance(it, GrpoReward) and it.group_id == g.group_id
            }
            for i in range(g.size):
                rewards[r, len(mask_rows[r]) - 1] = by_index[i]
                index.append(g.group_id)
                r += 1
    else:
        response_mask = loss_mask.float()
        teacher_rows = []
        for tid, m in zip(batch.trajectories, mask_rows, strict=True):
            t_lp = [
                x
                for it in sorted(
                    (it for it in items if isinstance(it, OpdTurn) and it.traj_id == tid),
                    key=lambda t: t.turn,
                )
                for x in it.teacher_logprobs
            ]
            row = torch.zeros(len(m), dtype=lp.dtype)
            row[torch.tensor(m, dtype=torch.bool)] = torch.tensor(t_lp, dtype=lp.dtype)
            teacher_rows.append(row)
        teacher = _pad(teacher_rows, width, lp.dtype)
        kl = ppo_utils.compute_approx_kl(
            lp.detach(), teacher, loss_mask=loss_mask, kl_estimator_type="k1"
        )
        rewards = -kl
        index = list(batch.trajectories)
    adv, _ = ppo_utils.compute_advantages_and_returns(
        token_level_rewards=rewards,
        response_mask=response_mask,
        index=np.array(index, dtype=object),
        adv_estimator=algo.advantage_estimator,
        config=cfg,
    )
    adv = ppo_utils.apply_loss_reduction_to_advantages_minibatch(
        adv.to(lp.dtype), loss_mask, algo.loss_reduction, len(lp_rows), width
    )
    policy_loss = ppo_utils.PolicyLossRegistry.get(algo.policy_loss_type)
    loss, _ = policy_loss(lp, lp.detach(), adv, cfg, loss_mask)
    return loss


def parity_config(
    objective: Objective, dtype: str = "float32", algo: SkyRLAlgorithm | None = None
) -> RunConfig:
    """The streaming learner's settings for SkyRL algorithm `algo` (the switch's own mapping)."""
    algo = algo or SkyRLAlgorithm.for_objective(objective)
    learner: dict[str, Any] = {"max_open_groups": 2, "device": "cpu", "accum_dtype": "float32"}
    if dtype == "float64":
        learner["accum_dtype"] = "float64"
    learner |= learner_settings(algo.config(), objective)
    return load_run_config(
        data={
            "objective": objective.value,
            "model": {"dtype": dtype},
            "optim": {"lr": 1e-3, "max_grad_norm": 1.0},
            "learner": learner,
        }
    )


def flat64(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """The tensors as one float64 vector (parameter gaps)."""
    return torch.cat([p.detach().reshape(-1).double() for p in params])


def run_parity(
    objective: Objective,
    *,
    updates: int = 4,
    seed: int = 0,
    dtype: str = "float32",
    loss_reduction: str | None = None,
) -> dict[str, Any]:
    """Per update, at the same weights: the relative gap between the streaming gradient and
    SkyRL's. After all updates, each side having trained on its own: the parameter gap
    ||theta_ours - theta_skyrl|| / ||theta_skyrl - theta_0||."""
    from thundersync.bench.equivalence import make_batches, make_models
    from thundersync.hf_models import load_model
    from thundersync.learner.device import DTYPES
    from thundersync.learner.trainer import Learner

    algo = SkyRLAlgorithm.for_objective(objective, loss_reduction=loss_reduction)
    cfg = parity_config(objective, dtype, algo)
    with tempfile.TemporaryDirectory() as tmp:
        student, teacher = make_models(Path(tmp))
        batches = make_batches(objective, updates, teacher, 0.0, seed)
        ours = Learner(load_model(student, dtype=DTYPES[dtype]), cfg)
        probe = load_model(student, dtype=DTYPES[dtype])  # SkyRL's loss at our weights
        probe_params = [p for p in probe.parameters() if p.requires_grad]
        trainer = SkyRLSyncTrainer(load_model(student, dtype=DTYPES[dtype]), cfg, algo)
        theta0 = flat64(trainer.params)
        errs = []
        for b in batches:
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(
                    ours.flat_params().to(DTYPES[dtype]), probe_params
                )
            gs = torch.autograd.grad(skyrl_batch_loss(probe, b, algo), probe_params)
            g = torch.cat([x.reshape(-1) for x in gs]).double()
            g_ours = replay_update(ours, b, Schedule.STREAM).grad.double().cpu()
            errs.append(float((g_ours - g).norm() / g.norm().clamp_min(1e-30)))
            trainer.step(b)
        theta = flat64(trainer.params)
        gap = float((ours.flat_params().double() - theta).norm() / (theta - theta0).norm())
    return {
        "objective": objective.value,
        "dtype": dtype,
        "skyrl_algorithm": algo.__dict__,
        "learner_estimator": cfg.learner.estimator.value if objective is Objective.GRPO else None,
        "updates": updates,
        "grad_rel_err": errs,
        "parity_grad_rel_err": max(errs),
        "parity_param_gap": gap,
    }


class SkyRLSyncTrainer:
    """SkyRL's synchronous update on one rank: its batch loss, one backward, its global-norm
    clip (torch's `clip_grad_norm_`, as its FSDP strategy) and AdamW."""

    def __init__(self, model: nn.Module, cfg: RunConfig, algo: SkyRLAlgorithm) -> None:
        self.model, self.algo = model, algo
        self.max_norm = cfg.optim.max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = adamw(self.params, cfg.optim)

    def step(self, batch: LoggedBatch) -> None:
        skyrl_batch_loss(self.model, batch, self.algo).backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
