"""The per-rank gradient engine of one update: applies released sources as soon as it may.

Reads like the maths in docs/DESIGN.md:
  GRPO content i  -> H_i = grad S_i at theta_k over the continuation, with the prompt K/V as leaves;
                     G2 += H_i; once r_i is bound, G1 += (r_i - c) H_i (held until then)
  group close     -> g_G = (alpha G1 + beta G2) / m; its prompt-leaf part goes through the prompt
                     graph once (one prompt backward per group)
  OPD turn j      -> grad of sum_t A_jt log pi over turn j, with earlier turns' K/V as leaves; the
                     leaves' adjoints go to a ledger; the update sum stays unnormalised
  OPD close       -> ledgers propagated back through the kept turn graphs once, last turn first
Nothing here normalises, reduces across ranks or steps: that is the barrier's job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from learner.accumulators import FlatSpec, OrderedSum, UpdateAccumulator
from learner.boundary import KV, detach_leaves, run_segment, token_logprobs
from learner.objectives import group_coefficients, opd_advantages
from learner.sources import (
    GrpoContent,
    GrpoGroupSpec,
    GrpoReward,
    OpdClose,
    OpdTurn,
    ReadyQueue,
    Releaser,
    WorkItem,
)
from tsrl.config import Estimator, Schedule


class SourceError(ValueError):
    """A source whose content cannot be applied (wrong shapes, unknown group, ...)."""


@dataclass
class _Group:
    spec: GrpoGroupSpec
    prompt_kv: list[KV]
    leaves: list[KV]
    leaf_spec: FlatSpec
    g1: OrderedSum  # sum_i (r_i - c) H_i, fixed reduction order
    g2: OrderedSum  # sum_i H_i
    shift: float | None = None
    rewards: dict[int, float] = field(default_factory=dict)
    held: dict[int, torch.Tensor] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)


@dataclass
class _Traj:
    acc: torch.Tensor  # this trajectory's unnormalised sum: reaches the update only at close
    pos: int = 0
    scored: int = 0
    next_turn: int = 0
    kv_out: list[list[KV]] = field(default_factory=list)
    leaves: list[list[KV]] = field(default_factory=list)
    ledger: list[list[torch.Tensor]] = field(default_factory=list)


def _flat(kv_list: list[KV]) -> list[torch.Tensor]:
    return [t for k, v in kv_list for t in (k, v)]


class GradientEngine:
    def __init__(
        self,
        model: nn.Module,
        params: list[nn.Parameter],
        *,
        schedule: Schedule = Schedule.STREAM,
        estimator: Estimator = Estimator.GRPO,
        std_eps: float = 1e-6,
        token_weighting: str = "seq_mean",
        max_open_groups: int = 4,
        accum_dtype: torch.dtype = torch.float32,
        accum_device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.params = params
        self.device = params[0].device if params else torch.device("cpu")
        self.acc_device = torch.device(accum_device)
        self.spec = FlatSpec(params, device=self.acc_device)
        self.estimator = estimator
        self.std_eps = std_eps
        self.token_weighting = token_weighting
        self.max_open = max_open_groups
        self.dtype = accum_dtype
        # the update's running sum spans groups closing in any order: fp64 keeps it order-free
        self.acc = UpdateAccumulator(self.spec.total, torch.float64, device=self.acc_device)
        self.queue = ReadyQueue()
        self.releaser = Releaser(schedule, self.queue)
        self.group_specs: dict[str, GrpoGroupSpec] = {}
        self.groups: dict[str, _Group] = {}
        self.trajs: dict[str, _Traj] = {}
        self.expected_trajs: set[str] = set()
        self.closed: set[str] = set()
        self.pending_rewards: dict[str, dict[int, float]] = {}
        self.applied: set[str] = set()
        self.counters: Counter[str] = Counter()
        self.peak_open = 0

    # ---- registration and submission -------------------------------------------------------
    def register_group(self, spec: GrpoGroupSpec) -> None:
        if len(spec.prompt_ids) < 1:
            raise SourceError(f"group {spec.group_id}: empty prompt; give at least one token")
        self.group_specs[spec.group_id] = spec
        self.releaser.expect_group(spec.group_id, spec.size)

    def register_trajectory(self, traj_id: str) -> None:
        self.expected_trajs.add(traj_id)

    def submit(self, item: WorkItem, ready: float) -> None:
        if isinstance(item, GrpoContent | GrpoReward) and item.group_id not in self.group_specs:
            raise SourceError(f"source {item.source_id}: group {item.group_id!r} is not registered")
        if isinstance(item, OpdTurn | OpdClose) and item.traj_id not in self.expected_trajs:
            raise SourceError(
                f"source {item.source_id}: trajectory {item.traj_id!r} not registered"
            )
        self.releaser.submit(item, ready)

    def close_batch(self, now: float = float("inf")) -> None:
        self.releaser.close_batch(now)

    # ---- the ready queue -------------------------------------------------------------------
    def _admissible(self, item: WorkItem) -> bool:
        key = item.key
        if isinstance(item, GrpoReward):
            return True  # binding a reward allocates nothing
        if isinstance(item, OpdTurn):
            t = self.trajs.get(key)
            if (t.next_turn if t else 0) != item.turn:
                return False  # earlier turns first: their K/V are this turn's leaves
        if isinstance(item, OpdClose):
            t = self.trajs.get(key)
            return t is not None and t.next_turn == item.num_turns
        return key in self.groups or key in self.trajs or self._open_count() < self.max_open

    def _open_count(self) -> int:
        return len(self.groups) + len(self.trajs)

    def step_one(self) -> WorkItem | None:
        """Apply the next admissible released source; None when nothing can run now."""
        item = self.queue.pop(self._admissible)
        if item is None:
            return None
        if item.source_id in self.applied:
            self.counters["duplicates_skipped"] += 1
            return item
        self.applied.add(item.source_id)
        if isinstance(item, GrpoContent):
            self._grpo_content(item)
        elif isinstance(item, GrpoReward):
            self._grpo_reward(item)
        elif isinstance(item, OpdTurn):
            self._opd_turn(item)
        else:
            self._opd_close(item)
        self.counters["work_items"] += 1
        self.peak_open = max(self.peak_open, self._open_count())
        return item

    def drain(self) -> int:
        n = 0
        while self.step_one() is not None:
            n += 1
        return n

    # ---- GRPO ------------------------------------------------------------------------------
    def _open_group(self, gid: str) -> _Group:
        g = self.groups.get(gid)
        if g is not None:
            return g
        spec = self.group_specs[gid]
        prefix = torch.tensor(spec.prompt_ids[:-1], dtype=torch.long, device=self.device)
        prompt_kv: list[KV] = []
        if len(prefix):
            prompt_kv = run_segment(self.model, prefix, past=[], start=0, logits=False).kv
            self.counters["prompt_forwards"] += 1
            self.counters["tokens_forward"] += len(prefix)
        leaves = detach_leaves(prompt_kv)
        leaf_spec = FlatSpec(_flat(leaves), device=self.acc_device)
        g = _Group(spec, prompt_kv, leaves, leaf_spec, OrderedSum(spec.size), OrderedSum(spec.size))
        self.groups[gid] = g
        for idx, r in self.pending_rewards.pop(gid, {}).items():  # arrival order fixes c
            self._bind(g, idx, r)
        return g

    def _grpo_content(self, item: GrpoContent) -> None:
        g = self._open_group(item.group_id)
        if len(item.response_ids) != len(item.response_mask):
            raise SourceError(
                f"source {item.source_id}: {len(item.response_ids)} response tokens but "
                f"{len(item.response_mask)} mask entries; give one mask entry per token"
            )
        prompt = g.spec.prompt_ids
        cont = torch.tensor((prompt[-1], *item.response_ids), dtype=torch.long, device=self.device)
        past = [g.leaves] if g.leaves else []
        out = run_segment(self.model, cont, past=past, start=len(prompt) - 1)
        self.counters["continuation_forwards"] += 1
        self.counters["tokens_forward"] += len(cont)
        lp = token_logprobs(out.logits, cont)
        mask = torch.tensor(item.response_mask, dtype=lp.dtype, device=self.device)
        n_scored = float(mask.sum())
        w = 1.0 / max(n_scored, 1.0) if self.token_weighting == "seq_mean" else 1.0
        s = (lp * mask).sum() * w
        leaves = _flat(g.leaves)
        grads = torch.autograd.grad(s, [*self.params, *leaves], allow_unused=True)
        h = self.spec.flatten(grads[: len(self.params)], self.dtype)
        if leaves:
            h = torch.cat([h, g.leaf_spec.flatten(grads[len(self.params) :], self.dtype)])
        g.g2.add(item.index, h)
        if item.index in g.rewards:
            g.g1.add(item.index, h * (g.rewards[item.index] - float(g.shift or 0.0)))
        else:
            g.held[item.index] = h  # late reward binding: the held gradient waits for r_i
        g.done.add(item.index)
        self.counters["held_peak"] = max(self.counters["held_peak"], len(g.held))
        self._maybe_close_group(g)

    def _bind(self, g: _Group, idx: int, reward: float) -> None:
        if g.shift is None:
            g.shift = reward
        g.rewards[idx] = reward
        h = g.held.pop(idx, None)
        if h is not None:
            g.g1.add(idx, h * (reward - g.shift))

    def _grpo_reward(self, item: GrpoReward) -> None:
        g = self.groups.get(item.group_id)
        if g is None:
            self.pending_rewards.setdefault(item.group_id, {})[item.index] = item.reward
            return
        self._bind(g, item.index, item.reward)
        self._maybe_close_group(g)

    def _maybe_close_group(self, g: _Group) -> None:
        m = g.spec.size
        if len(g.done) < m or len(g.rewards) < m:
            return
        rewards = [g.rewards[i] for i in sorted(g.rewards)]
        coef = group_coefficients(
            self.estimator, rewards, shift=g.shift if g.shift is not None else 0.0, eps=self.std_eps
        )
        combined = (
            g.g1.result().mul(coef.alpha / coef.m).add_(g.g2.result(), alpha=coef.beta / coef.m)
        )
        self.acc.add(combined[: self.spec.total])
        if g.prompt_kv:
            adj = g.leaf_spec.unflatten(combined[self.spec.total :])
            self.acc.add(self._backprop(_flat(g.prompt_kv), adj, self.params))
            self.counters["prompt_backwards"] += 1
        self.acc.groups_closed += 1
        del self.groups[g.spec.group_id]
        self.closed.add(g.spec.group_id)

    # ---- OPD -------------------------------------------------------------------------------
    def _opd_turn(self, item: OpdTurn) -> None:
        t = self.trajs.get(item.traj_id)
        if t is None:  # its own sum, in the accumulator dtype (float64 reaches ~1e-15)
            acc = torch.zeros(self.spec.total, dtype=self.dtype, device=self.acc_device)
            t = self.trajs[item.traj_id] = _Traj(acc)
        if len(item.token_ids) != len(item.action_mask):
            raise SourceError(
                f"source {item.source_id}: {len(item.token_ids)} tokens but "
                f"{len(item.action_mask)} mask entries; give one mask entry per token"
            )
        if item.start is not None and item.start != t.pos:
            raise SourceError(
                f"source {item.source_id}: the segment starts at position {item.start} but the "
                f"turns before it end at {t.pos}; send each turn's segment from where the last ended"
            )
        if item.action_mask and item.action_mask[0]:
            raise SourceError(
                f"source {item.source_id}: the first token of a turn segment is scored; start the "
                "segment with at least one unscored token (the observation or prompt)"
            )
        tokens = torch.tensor(item.token_ids, dtype=torch.long, device=self.device)
        out = run_segment(self.model, tokens, past=t.leaves, start=t.pos)
        self.counters["turn_forwards"] += 1
        self.counters["tokens_forward"] += len(tokens)
        mask = torch.tensor(item.action_mask[1:], dtype=torch.bool, device=self.device)
        scored = token_logprobs(out.logits, tokens)[mask]
        teacher = torch.tensor(item.teacher_logprobs, dtype=scored.dtype, device=self.device)
        try:
            adv = opd_advantages(teacher, scored)
        except ValueError as e:
            raise SourceError(f"source {item.source_id}: {e}") from None
        earlier = [x for seg in t.leaves for x in _flat(seg)]
        obj = (adv * scored).sum()
        if scored.numel():
            grads = torch.autograd.grad(
                obj, [*self.params, *earlier], retain_graph=True, allow_unused=True
            )
            t.acc += self.spec.flatten(grads[: len(self.params)], t.acc.dtype)
            self._to_ledger(t, grads[len(self.params) :], upto=len(t.leaves))
        t.scored += int(scored.numel())
        t.kv_out.append(out.kv)
        t.leaves.append(detach_leaves(out.kv))
        # fp32 ledgers (float64 with a float64 model): adjoints summed over later turns
        ledger_dtype = torch.promote_types(out.kv[0][0].dtype, torch.float32)
        t.ledger.append([torch.zeros_like(x, dtype=ledger_dtype) for x in _flat(out.kv)])
        t.pos += len(tokens)
        t.next_turn += 1

    @staticmethod
    def _to_ledger(t: _Traj, grads: tuple[torch.Tensor | None, ...], upto: int) -> None:
        i = 0
        for j in range(upto):
            for slot in range(len(t.ledger[j])):
                gr = grads[i]
                if gr is not None:
                    t.ledger[j][slot] += gr
                i += 1

    def _opd_close(self, item: OpdClose) -> None:
        t = self.trajs.pop(item.traj_id)
        for j in reversed(range(item.num_turns)):
            adj = t.ledger[j]
            if not any(bool(a.any()) for a in adj):
                continue  # nothing downstream read this turn's K/V (e.g. the last turn)
            earlier = [x for seg in t.leaves[:j] for x in _flat(seg)]
            grads = self._grad_through(_flat(t.kv_out[j]), adj, [*self.params, *earlier])
            t.acc += self.spec.flatten(grads[: len(self.params)], t.acc.dtype)
            self._to_ledger(t, grads[len(self.params) :], upto=j)
            self.counters["deferred_propagations"] += 1
        self.acc.add(t.acc)
        self.acc.scored_tokens += t.scored
        self.closed.add(item.traj_id)
        self.acc.groups_closed += 1

    def _grad_through(
        self, outs: list[torch.Tensor], adj: list[torch.Tensor], inputs: list[torch.Tensor]
    ) -> tuple[torch.Tensor | None, ...]:
        """Vector-Jacobian product of `adj` through `outs`; frozen outputs (LoRA) are skipped."""
        pairs = [
            (o, a.to(device=o.device, dtype=o.dtype))
            for o, a in zip(outs, adj, strict=True)
            if o.requires_grad
        ]
        if not pairs:
            return tuple(None for _ in inputs)
        return torch.autograd.grad(
            [o for o, _ in pairs], inputs, grad_outputs=[a for _, a in pairs], allow_unused=True
        )

    def _backprop(
        self, outs: list[torch.Tensor], adj: list[torch.Tensor], params: list[nn.Parameter]
    ) -> torch.Tensor:
        return self.spec.flatten(self._grad_through(outs, adj, list(params)), self.dtype)

    def abort(self, key: str) -> None:
        """Drop a group / trajectory whose rollout failed: none of its work reaches the update.

        Its sources already applied are discarded with it (they live in the group's G1/G2 or the
        trajectory's own sum until close); the rerun comes back under a new key.
        """
        if key in self.closed:
            raise SourceError(f"{key} already closed: its gradient is in the update; cannot abort")
        self.groups.pop(key, None)
        self.trajs.pop(key, None)
        self.group_specs.pop(key, None)
        self.expected_trajs.discard(key)
        self.pending_rewards.pop(key, None)
        self.releaser.drop(key)
        self.queue.drop(key)
        self.counters["aborted"] += 1

    # ---- barrier support -------------------------------------------------------------------
    def open_sources(self) -> list[str]:
        """Every reason this update cannot step yet (empty when it can)."""
        why = []
        if len(self.queue):
            why.append(f"{len(self.queue)} released sources not yet applied")
        held = sum(len(v) for v in self.releaser._held.values())
        if held:
            why.append(f"{held} sources held by the {self.releaser.schedule.value} schedule")
        why += [f"group {gid} open" for gid in self.groups]
        why += [f"trajectory {tid} open" for tid in self.trajs]
        missing = set(self.group_specs) - self.closed - set(self.groups)
        missing |= self.expected_trajs - self.closed - set(self.trajs)
        why += [f"{key} registered but never closed" for key in sorted(missing)]
        return why
