"""OPD work items: a teacher-scored turn, and the trajectory's close.

turn j -> grad of sum_t A_jt log pi over turn j, the earlier turns' K/V as leaves (views of the
          trajectory's K/V store); the leaves' adjoints go to the store's ledger; the
          trajectory's own sum stays unnormalised
close  -> the ledger propagated back through each turn's graph once, last turn first: the
          kept graph (`keep`) or a re-forward of the turn from its stored K/V (`recompute`,
          one extra forward per turn, memory linear in the number of turns)

`segment_tokens` (`learner.opd_segment_tokens`) runs a turn as consecutive segments of at most S
tokens, each exactly like a turn (its past includes the earlier segments of the same turn, its
own `Turn` entry for close): activations scale with S, not with the turn's length. Segment
[a, b) scores targets a+1..b: its last hidden row predicts the first token of the next segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thundersync.learner.accumulators import ParamSum
from thundersync.learner.boundary import KV, run_segment
from thundersync.learner.engine_core import EngineCore, SourceError, flat_kv
from thundersync.learner.kvstore import KVStore
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.objectives import opd_advantages
from thundersync.learner.objectives.opd import DistillStats
from thundersync.learner.sources import OpdClose, OpdTurn


@dataclass
class Turn:
    start: int
    tokens: torch.Tensor
    kept: tuple[list[KV], list[KV]] | None = None  # (own K/V in the graph, its past leaves)


@dataclass
class Traj:
    acc: ParamSum  # this trajectory's unnormalised sum: reaches the update only at close
    store: KVStore
    pos: int = 0
    scored: int = 0
    kl_sum: float = 0.0  # the update's metrics take these at close only
    loss_sum: float = 0.0
    next_turn: int = 0
    turns: list[Turn] = field(default_factory=list)

    def free(self) -> None:
        self.acc.free()
        self.store.free()
        self.turns.clear()

    @property
    def ledger(self) -> list[list[torch.Tensor]]:
        return self.store.ledger


def _check(item: OpdTurn, t: Traj) -> None:
    """The whole turn, before any segment of it touches the trajectory's sum or store."""
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
    n_scored = sum(1 for m in item.action_mask if m)
    if len(item.teacher_logprobs) != n_scored:
        raise SourceError(
            f"source {item.source_id}: {len(item.teacher_logprobs)} teacher log-probs but the "
            f"turn has {n_scored} scored tokens: give one per scored (mask 1) token, in order"
        )


class OpdTrajectories:
    """One update's OPD trajectories: those registered, those open (their own sum, K/V store and
    kept turn graphs), and those already closed into the update's sum."""

    def __init__(
        self, core: EngineCore, *, keep_turn_graphs: bool, segment_tokens: int | None = None
    ) -> None:
        if segment_tokens is not None and segment_tokens < 1:
            raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
        self.core = core
        self.keep_turn_graphs = keep_turn_graphs
        self.segment_tokens = segment_tokens  # None: one segment per turn
        self.expected: set[str] = set()
        self.trajs: dict[str, Traj] = {}
        self.closed: set[str] = set()
        self.stats = DistillStats()  # closed trajectories' KL / loss (metrics only)

    def register(self, traj_id: str) -> None:
        self.expected.add(traj_id)

    def is_open(self, traj_id: str) -> bool:
        return traj_id in self.trajs

    def in_order(self, item: OpdTurn | OpdClose) -> bool:
        """Turns apply in order (earlier turns' K/V are a turn's leaves); close after the last."""
        t = self.trajs.get(item.traj_id)
        if isinstance(item, OpdClose):
            return t is not None and t.next_turn == item.num_turns
        return (t.next_turn if t else 0) == item.turn

    def unclosed(self) -> set[str]:
        """Registered trajectories neither open nor closed."""
        return self.expected - self.closed - set(self.trajs)

    def abort(self, traj_id: str) -> None:
        """Forget the trajectory and everything applied to it (its rerun comes under a new id)."""
        t = self.trajs.pop(traj_id, None)
        if t is not None:
            t.free()
        self.expected.discard(traj_id)

    def turn(self, item: OpdTurn) -> None:
        e = self.core
        t = self.trajs.get(item.traj_id)
        if t is None:  # its own sum, in the accumulator dtype (float64 reaches ~1e-15)
            store = KVStore(e.pool, limit=e.kv_limit)
            t = self.trajs[item.traj_id] = Traj(ParamSum(e.spec, e.pool, e.dtype), store)
        _check(item, t)
        tokens = torch.tensor(item.token_ids, dtype=torch.long, device=e.device)
        mask, n = item.action_mask, len(item.token_ids)
        rollout = item.rollout_logprobs
        if rollout is not None and len(rollout) != len(item.teacher_logprobs):
            rollout = None  # the metric skips a turn whose engine log-probs do not match
        step, k = self.segment_tokens or max(n, 1), 0  # k: scored tokens before the segment
        for a in range(0, n, step):
            b = min(a + step, n)
            seg_mask = mask[a + 1 : b + 1]  # the targets a+1..b, the last segment's one fewer
            m = sum(1 for x in seg_mask if x)
            self._segment(
                t,
                tokens[a : b + 1],
                b - a,
                seg_mask,
                item.teacher_logprobs[k : k + m],
                rollout[k : k + m] if rollout is not None else None,
                item.source_id,
            )
            k += m
        t.next_turn += 1

    def _segment(
        self,
        t: Traj,
        ids: torch.Tensor,
        own: int,
        mask: tuple[int, ...],
        teacher_lp: tuple[float, ...],
        rollout: tuple[float, ...] | None,
        source_id: str,
    ) -> None:
        """`own` tokens (`ids[:own]`; `ids[own]`, if there, is the next segment's first token,
        the target of the last row) on the trajectory's K/V so far."""
        e = self.core
        past = t.store.past(t.pos) if t.pos else []
        out = run_segment(e.model, ids[:own], past=past, start=t.pos, checkpoint=e.checkpoint)
        e.counters["turn_forwards"] += 1
        e.counters["tokens_forward"] += own
        scored_mask = torch.tensor(mask, dtype=torch.bool, device=e.device)
        scored = scored_logprobs(e.model, out.hidden, ids, scored_mask, chunk=e.logprob_chunk)
        e.mismatch.observe(scored, rollout)
        teacher = torch.tensor(teacher_lp, dtype=scored.dtype, device=e.device)
        try:
            adv = opd_advantages(teacher, scored)
        except ValueError as err:
            raise SourceError(f"source {source_id}: {err}") from None
        kl, loss = DistillStats.of_turn(adv, scored)
        t.kl_sum += kl
        t.loss_sum += loss
        if scored.numel():  # the leaves' adjoints reach the ledger in their hooks (kvstore)
            e.routed_backward(
                [(t.acc, 1.0)],
                [(adv * scored).sum()],
                leaves=flat_kv(past),
                retain_graph=self.keep_turn_graphs,
            )
        t.scored += int(scored.numel())
        kept = (out.kv, past) if self.keep_turn_graphs else None
        t.turns.append(Turn(t.pos, ids[:own], kept))
        t.store.append([(k.detach(), v.detach()) for k, v in out.kv])
        t.pos += own

    def close(self, item: OpdClose) -> None:
        e = self.core
        t = self.trajs.pop(item.traj_id)
        for tj in reversed(t.turns):  # segments, last first (a turn may be several)
            adj = t.store.adjoint(tj.start, tj.start + len(tj.tokens))
            if not any(bool(a.any()) for a in adj):
                continue  # nothing downstream read this turn's K/V (e.g. the last turn)
            if tj.kept is not None:
                own, past = tj.kept
            else:  # recompute: re-forward the turn on fresh leaves of the same stored K/V
                past = t.store.past(tj.start) if tj.start else []
                own = run_segment(
                    e.model, tj.tokens, past=past, start=tj.start, checkpoint=e.checkpoint
                ).kv
                e.counters["turn_recomputes"] += 1
            # the past leaves' adjoints go into ledger[:start] in their hooks (kvstore)
            e.backprop([(t.acc, 1.0)], flat_kv(own), adj, flat_kv(past))
            tj.kept = None  # its graph is spent
            e.counters["deferred_propagations"] += 1
        with e.bookkeeping():
            e.acc.take(t.acc)  # the update owns the trajectory's sum now
        e.acc.scored_tokens += t.scored
        self.stats.add(t.kl_sum, t.loss_sum, t.scored)
        t.store.free()
        t.turns.clear()
        self.closed.add(item.traj_id)
        e.acc.groups_closed += 1
