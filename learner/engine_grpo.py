"""GRPO work items: a trajectory's content, its reward, and the group's close.

  content i  -> H_i = grad S_i at theta_k over the continuation, the prompt K/V as leaves;
                G2 += H_i, and once r_i is bound G1 += (r_i - c) H_i (H_i held until then)
  close      -> g_G = (alpha G1 + beta G2) / m into the update sum; its prompt-leaf part goes
                through the prompt graph once (one prompt backward per group)
G1 and G2 are pooled flat buffers updated in place (`learner.accumulators`): two full-size vectors
per open group, whatever the arrival order.

Arrival order (`learner.grpo_sum`). `arrival` (default): G1/G2 in `accum_dtype` (fp32), summed in
arrival order, c = the group's first bound reward (unless `learner.reward_shift` fixes it):
schedules fed one order agree bit for bit, another order changes fp32 roundings. `float64`: G1/G2,
held H_i and the leaf ledgers in float64 and c fixed before any reward (`learner.reward_shift`,
default 0), so nothing depends on which reward came first and the order of m float64 adds moves
g_G by ~1e-16 relative, which the fp32 step gradient almost never sees (the bench's reordered
control is 0.0; rarely one coordinate rounds 1 ulp the other way: docs/RESULTS.md). Why not
c = first reward there: it is arrival-dependent; why not c = 0 in fp32: at r ~ 1e6 G1 ~ r H_i
loses r / spread * 6e-8 (~6%) to the cancellation. Cost: 16 instead of 8 bytes per parameter per
open group (`grpo_sum_dtype`; a planner reads it), float64 instead of fp32 adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from thundersync.config import Estimator, GrpoSum
from thundersync.learner.accumulators import ParamSum, add_into
from thundersync.learner.boundary import KV, detach_leaves, run_segment
from thundersync.learner.engine_core import EngineCore, SourceError, flat_kv, take_grads
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.objectives import group_coefficients, min_group_size
from thundersync.learner.routing import Target
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward


@dataclass
class Group:
    spec: GrpoGroupSpec
    prompt_kv: list[KV]  # the prompt's K/V, still in the prompt graph
    leaves: list[KV]  # the same K/V as detached leaves: the continuations' past
    g1: ParamSum  # sum_i (r_i - c) H_i
    g2: ParamSum  # sum_i H_i
    leaf_g1: list[torch.Tensor]  # the same two sums for the prompt-leaf adjoints (small)
    leaf_g2: list[torch.Tensor]
    shift: float | None  # c: fixed before any reward, or (None) the first one bound
    scored: int = 0  # scored tokens of the members applied so far
    rewards: dict[int, float] = field(default_factory=dict)
    held: dict[int, tuple[ParamSum, list[torch.Tensor | None]]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def free(self) -> None:
        self.g1.free()
        self.g2.free()
        for h, _ in self.held.values():
            h.free()
        self.held.clear()


def grpo_sum_dtype(grpo_sum: GrpoSum | str, accum_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a GRPO group's G1 / G2 (two full-size vectors per open group)."""
    return torch.float64 if GrpoSum(grpo_sum) is GrpoSum.FLOAT64 else accum_dtype


def fixed_shift(grpo_sum: GrpoSum | str, reward_shift: float | None) -> float | None:
    """c fixed before any reward; None: each group's first bound reward (`arrival` only)."""
    if reward_shift is None and GrpoSum(grpo_sum) is GrpoSum.FLOAT64:
        return 0.0
    return reward_shift


class GrpoGroups:
    """One update's GRPO groups: the registered specs, the open groups, the rewards that came
    before their group's first content, and the groups already closed into the update's sum."""

    def __init__(
        self,
        core: EngineCore,
        *,
        estimator: Estimator,
        std_eps: float,
        token_weighting: str,
        per_token: bool = False,
        grpo_sum: GrpoSum = GrpoSum.ARRIVAL,
        reward_shift: float | None = None,
    ) -> None:
        self.core = core
        self.dtype = grpo_sum_dtype(grpo_sum, core.dtype)  # G1, G2, held H_i, leaf ledgers
        self.shift = fixed_shift(grpo_sum, reward_shift)
        self.estimator = estimator
        self.std_eps = std_eps
        self.token_weighting = token_weighting
        # token_mean: g_G = alpha G1 + beta G2 without 1/m, the update divided by its scored
        # tokens at the barrier (each closed group adds its members' count)
        self.per_token = per_token
        self.specs: dict[str, GrpoGroupSpec] = {}
        self.groups: dict[str, Group] = {}
        self.pending_rewards: dict[str, dict[int, float]] = {}
        self.closed: set[str] = set()

    def register(self, spec: GrpoGroupSpec) -> None:
        if len(spec.prompt_ids) < 1:
            raise SourceError(f"group {spec.group_id}: empty prompt; give at least one token")
        self.specs[spec.group_id] = spec

    def is_open(self, gid: str) -> bool:
        return gid in self.groups

    def unclosed(self) -> set[str]:
        """Registered groups neither open nor closed."""
        return set(self.specs) - self.closed - set(self.groups)

    def abort(self, gid: str) -> None:
        """Forget the group and everything applied to it (its rerun comes under a new id)."""
        g = self.groups.pop(gid, None)
        if g is not None:
            g.free()
        self.specs.pop(gid, None)
        self.pending_rewards.pop(gid, None)

    def drop_member(self, gid: str, index: int) -> bool:
        """Member `index` failed and is dropped (`rollout.on_failure: drop`): the group closes
        over the others, its statistics and 1/m over them only, exactly as sync training on the
        batch without that row. True when the group fell below the estimator's minimum and was
        forgotten whole (whatever it had applied with it). A member whose source was already
        applied cannot leave: its H_i is inside G1/G2 and subtracting it would not be exact."""
        spec = self.specs.get(gid)
        if spec is None:
            raise SourceError(f"drop of {gid}[{index}]: group {gid!r} is not registered")
        g = self.groups.get(gid)
        applied = (g.done | set(g.rewards)) if g else set(self.pending_rewards.get(gid, {}))
        if index in applied:
            raise SourceError(
                f"drop of {gid}[{index}]: its sources are already applied; a trajectory can be "
                "dropped only before its reward and content are sent"
            )
        size = spec.size - 1
        if size < min(min_group_size(self.estimator), spec.size):
            self.abort(gid)
            return True
        spec = self.specs[gid] = replace(spec, size=size)
        if g is not None:
            g.spec = spec
            self._maybe_close(g)
        return False

    def content(self, item: GrpoContent) -> None:
        e = self.core
        g = self._open(item.group_id)
        if len(item.response_ids) != len(item.response_mask):
            raise SourceError(
                f"source {item.source_id}: {len(item.response_ids)} response tokens but "
                f"{len(item.response_mask)} mask entries; give one mask entry per token"
            )
        prompt = g.spec.prompt_ids
        cont = torch.tensor((prompt[-1], *item.response_ids), dtype=torch.long, device=e.device)
        out = run_segment(
            e.model, cont, past=g.leaves, start=len(prompt) - 1, checkpoint=e.checkpoint
        )
        e.counters["continuation_forwards"] += 1
        e.counters["tokens_forward"] += len(cont)
        mask = torch.tensor(item.response_mask, dtype=torch.bool, device=e.device)
        lp = scored_logprobs(e.model, out.hidden, cont, mask, chunk=e.logprob_chunk)
        e.mismatch.observe(lp, item.rollout_logprobs)
        n_scored = float(mask.sum())
        g.scored += int(n_scored)
        w = 1.0 / max(n_scored, 1.0) if self.token_weighting == "seq_mean" else 1.0
        s = lp.sum() * w
        leaves = flat_kv(g.leaves)
        known = item.index in g.rewards
        r = g.rewards[item.index] - float(g.shift or 0.0) if known else 0.0
        held = None if known else ParamSum(e.spec, e.pool, self.dtype)  # H_i waits for r_i
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
        self._maybe_close(g)

    def reward(self, item: GrpoReward) -> None:
        g = self.groups.get(item.group_id)
        if g is None:
            self.pending_rewards.setdefault(item.group_id, {})[item.index] = item.reward
            return
        self._bind(g, item.index, item.reward)
        self._maybe_close(g)

    def _open(self, gid: str) -> Group:
        g = self.groups.get(gid)
        if g is not None:
            return g
        e = self.core
        spec = self.specs[gid]
        prefix = torch.tensor(spec.prompt_ids[:-1], dtype=torch.long, device=e.device)
        prompt_kv: list[KV] = []
        if len(prefix):
            prompt_kv = run_segment(e.model, prefix, past=[], start=0, checkpoint=e.checkpoint).kv
            e.counters["prompt_forwards"] += 1
            e.counters["tokens_forward"] += len(prefix)
        leaves = detach_leaves(prompt_kv)
        ldt = self.dtype
        g = Group(
            spec,
            prompt_kv,
            leaves,
            ParamSum(e.spec, e.pool, self.dtype),
            ParamSum(e.spec, e.pool, self.dtype),
            [torch.zeros_like(x, dtype=ldt) for x in flat_kv(leaves)],
            [torch.zeros_like(x, dtype=ldt) for x in flat_kv(leaves)],
            self.shift,
        )
        self.groups[gid] = g
        for idx, r in self.pending_rewards.pop(gid, {}).items():  # c, unless fixed: arrival
            self._bind(g, idx, r)
        return g

    def _bind(self, g: Group, idx: int, reward: float) -> None:
        if g.shift is None:
            g.shift = reward
        g.rewards[idx] = reward
        held = g.held.pop(idx, None)
        if held is not None:
            with self.core.bookkeeping():
                h, lh = held
                if reward != g.shift:  # else H_i adds nothing to G1
                    g.g1.add_vector(h.flat, reward - g.shift)
                    add_into(g.leaf_g1, lh, reward - g.shift)
                h.free()

    def _maybe_close(self, g: Group) -> None:
        m = g.spec.size
        if len(g.done) < m or len(g.rewards) < m:
            return
        e = self.core
        rewards = [g.rewards[i] for i in sorted(g.rewards)]
        coef = group_coefficients(
            self.estimator, rewards, shift=g.shift if g.shift is not None else 0.0, eps=self.std_eps
        )
        m_div = 1 if self.per_token else coef.m
        a, b = coef.alpha / m_div, coef.beta / m_div
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
        e.acc.scored_tokens += g.scored
        for h, _ in g.held.values():
            h.free()
        del self.groups[g.spec.group_id]
        self.closed.add(g.spec.group_id)
