"""GRPO work items: a trajectory's content, its reward, and the group's close.

  content i  -> H_i = grad S_i at theta_k over the continuation, the prompt K/V as leaves;
                G2 += H_i, and once r_i is bound G1 += (r_i - c) H_i (H_i held until then)
  close      -> g_G = (alpha G1 + beta G2) / m into the update sum; its prompt-leaf part goes
                through the prompt graph once (one prompt backward per group)
G1 and G2 are pooled flat buffers updated in place (`learner.accumulators`): two full-size vectors
per open group, whatever the arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from thundersync.learner.accumulators import ParamSum, add_into
from thundersync.learner.boundary import KV, detach_leaves, run_segment
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.objectives import group_coefficients
from thundersync.learner.routing import Target
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward

if TYPE_CHECKING:
    from thundersync.learner.engine import GradientEngine


class SourceError(ValueError):
    """A source whose content cannot be applied (wrong shapes, unknown group, ...)."""


def flat_kv(kv_list: list[KV]) -> list[torch.Tensor]:
    return [t for k, v in kv_list for t in (k, v)]


def take_grads(leaves: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """The leaves' accumulated adjoints, reset (leaves are reused by a group's continuations)."""
    out = [x.grad for x in leaves]
    for x in leaves:
        x.grad = None
    return out


@dataclass
class Group:
    spec: GrpoGroupSpec
    prompt_kv: list[KV]  # the prompt's K/V, still in the prompt graph
    leaves: list[KV]  # the same K/V as detached leaves: the continuations' past
    g1: ParamSum  # sum_i (r_i - c) H_i
    g2: ParamSum  # sum_i H_i
    leaf_g1: list[torch.Tensor]  # the same two sums for the prompt-leaf adjoints (small)
    leaf_g2: list[torch.Tensor]
    shift: float | None = None
    rewards: dict[int, float] = field(default_factory=dict)
    held: dict[int, tuple[ParamSum, list[torch.Tensor | None]]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def free(self) -> None:
        self.g1.free()
        self.g2.free()
        for h, _ in self.held.values():
            h.free()
        self.held.clear()


def open_group(e: GradientEngine, gid: str) -> Group:
    g = e.groups.get(gid)
    if g is not None:
        return g
    spec = e.group_specs[gid]
    prefix = torch.tensor(spec.prompt_ids[:-1], dtype=torch.long, device=e.device)
    prompt_kv: list[KV] = []
    if len(prefix):
        prompt_kv = run_segment(e.model, prefix, past=[], start=0, checkpoint=e.checkpoint).kv
        e.counters["prompt_forwards"] += 1
        e.counters["tokens_forward"] += len(prefix)
    leaves = detach_leaves(prompt_kv)
    ldt = e.dtype
    g = Group(
        spec,
        prompt_kv,
        leaves,
        ParamSum(e.spec, e.pool, e.dtype),
        ParamSum(e.spec, e.pool, e.dtype),
        [torch.zeros_like(x, dtype=ldt) for x in flat_kv(leaves)],
        [torch.zeros_like(x, dtype=ldt) for x in flat_kv(leaves)],
    )
    e.groups[gid] = g
    for idx, r in e.pending_rewards.pop(gid, {}).items():  # arrival order fixes c
        bind(e, g, idx, r)
    return g


def content(e: GradientEngine, item: GrpoContent) -> None:
    g = open_group(e, item.group_id)
    if len(item.response_ids) != len(item.response_mask):
        raise SourceError(
            f"source {item.source_id}: {len(item.response_ids)} response tokens but "
            f"{len(item.response_mask)} mask entries; give one mask entry per token"
        )
    prompt = g.spec.prompt_ids
    cont = torch.tensor((prompt[-1], *item.response_ids), dtype=torch.long, device=e.device)
    out = run_segment(e.model, cont, past=g.leaves, start=len(prompt) - 1, checkpoint=e.checkpoint)
    e.counters["continuation_forwards"] += 1
    e.counters["tokens_forward"] += len(cont)
    mask = torch.tensor(item.response_mask, dtype=torch.bool, device=e.device)
    lp = scored_logprobs(e.model, out.hidden, cont, mask, chunk=e.logprob_chunk)
    e.mismatch.observe(lp, item.rollout_logprobs)
    n_scored = float(mask.sum())
    w = 1.0 / max(n_scored, 1.0) if e.token_weighting == "seq_mean" else 1.0
    s = lp.sum() * w
    leaves = flat_kv(g.leaves)
    known = item.index in g.rewards
    r = g.rewards[item.index] - float(g.shift or 0.0) if known else 0.0
    held = None if known else ParamSum(e.spec, e.pool, e.dtype)  # H_i waits for r_i
    targets: list[Target] = [(g.g2, 1.0)]
    # r_i = c (common with 0/1 rewards): H_i adds nothing to G1, so that full-size add is skipped
    if held is not None or r != 0.0:
        targets.append((g.g1, r) if held is None else (held, 1.0))
    e.routed_backward(targets, [s], leaves=leaves)
    lh = take_grads(leaves)
    with e.bookkeeping():
        add_into(g.leaf_g2, lh)
        if held is not None:
            g.held[item.index] = (held, lh)
        elif r != 0.0:
            add_into(g.leaf_g1, lh, r)
    g.done.add(item.index)
    e.counters["held_peak"] = max(e.counters["held_peak"], len(g.held))
    maybe_close(e, g)


def bind(e: GradientEngine, g: Group, idx: int, reward: float) -> None:
    if g.shift is None:
        g.shift = reward
    g.rewards[idx] = reward
    held = g.held.pop(idx, None)
    if held is not None:
        with e.bookkeeping():
            h, lh = held
            if reward != g.shift:  # else H_i adds nothing to G1
                g.g1.add_vector(h.flat, reward - g.shift)
                add_into(g.leaf_g1, lh, reward - g.shift)
            h.free()


def reward(e: GradientEngine, item: GrpoReward) -> None:
    g = e.groups.get(item.group_id)
    if g is None:
        e.pending_rewards.setdefault(item.group_id, {})[item.index] = item.reward
        return
    bind(e, g, item.index, item.reward)
    maybe_close(e, g)


def maybe_close(e: GradientEngine, g: Group) -> None:
    m = g.spec.size
    if len(g.done) < m or len(g.rewards) < m:
        return
    rewards = [g.rewards[i] for i in sorted(g.rewards)]
    coef = group_coefficients(
        e.estimator, rewards, shift=g.shift if g.shift is not None else 0.0, eps=e.std_eps
    )
    a, b = coef.alpha / coef.m, coef.beta / coef.m
    g_dir = g.g1  # G1's buffer becomes g_G: a * G1 + b * G2 (+ the prompt's part), in place
    with e.bookkeeping():
        g_dir.flat.mul_(a).add_(g.g2.flat, alpha=b)
        g.g2.free()  # spent: the prompt backward and the update's sum need only g_G
        g.g2 = g_dir
    if g.prompt_kv:
        adj = [x1 * a + x2 * b for x1, x2 in zip(g.leaf_g1, g.leaf_g2, strict=True)]
        e.backprop([(g_dir, 1.0)], flat_kv(g.prompt_kv), adj, [])
        e.counters["prompt_backwards"] += 1
    with e.bookkeeping():
        e.acc.take(g_dir)  # the update owns g_G's buffer now
    e.acc.groups_closed += 1
    for h, _ in g.held.values():
        h.free()
    del e.groups[g.spec.group_id]
    e.closed.add(g.spec.group_id)
