"""The batch-synchronous reference: the textbook loss over whole sequences, one backward.

No cut boundaries, no accumulators, no schedule: every trajectory is a full forward of
[prompt; response] (OPD: all turns concatenated). The streaming engine must match this update.
"""

from __future__ import annotations

import torch
from torch import nn

from thundersync.config import Estimator, GroupReduction
from thundersync.learner.batch_replay import LoggedBatch
from thundersync.learner.objectives import advantages
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdTurn


def _seq_logprobs(model: nn.Module, ids: list[int]) -> torch.Tensor:
    x = torch.tensor(ids).view(1, -1)
    logits = model(input_ids=x).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:].view(-1, 1))[:, 0]


def reference_loss(
    model: nn.Module,
    batch: LoggedBatch,
    *,
    estimator: Estimator = Estimator.GRPO,
    std_eps: float = 1e-6,
    token_weighting: str = "seq_mean",
    group_reduction: GroupReduction = GroupReduction.SUM,
) -> torch.Tensor:
    items = [it for _, it in batch.events]
    if batch.groups:
        total = torch.zeros(())
        per_token = group_reduction is GroupReduction.TOKEN_MEAN
        scored = 0
        for g in batch.groups:
            content = {
                it.index: it
                for it in items
                if isinstance(it, GrpoContent) and it.group_id == g.group_id
            }
            reward = {
                it.index: it.reward
                for it in items
                if isinstance(it, GrpoReward) and it.group_id == g.group_id
            }
            adv = advantages(estimator, [reward[i] for i in range(g.size)], std_eps)
            for i in range(g.size):
                c = content[i]
                lp = _seq_logprobs(model, [*g.prompt_ids, *c.response_ids])
                mask = torch.tensor(
                    [0] * (len(g.prompt_ids) - 1) + list(c.response_mask), dtype=lp.dtype
                )
                w = 1.0 / max(float(mask.sum()), 1.0) if token_weighting == "seq_mean" else 1.0
                total = total + adv[i] * w * (lp * mask).sum() / (1 if per_token else g.size)
                scored += int(mask.sum())
        if per_token:  # every scored token of the update weighs the same
            return -total / scored
        return -total / (len(batch.groups) if group_reduction is GroupReduction.MEAN else 1)
    total = torch.zeros(())
    n_tokens = 0
    for tid in batch.trajectories:
        turns = sorted(
            (it for it in items if isinstance(it, OpdTurn) and it.traj_id == tid),
            key=lambda t: t.turn,
        )
        ids = [x for t in turns for x in t.token_ids]
        mask = torch.tensor([m for t in turns for m in t.action_mask][1:], dtype=torch.bool)
        teacher = torch.tensor([x for t in turns for x in t.teacher_logprobs])
        lp = _seq_logprobs(model, ids)[mask]
        total = total + ((teacher.to(lp.dtype) - lp).detach() * lp).sum()
        n_tokens += int(mask.sum())
    return -total / n_tokens
