"""OPD work items: a teacher-scored turn, and the trajectory's close.

turn j -> grad of sum_t A_jt log pi over turn j, the earlier turns' K/V as leaves (views of the
          trajectory's K/V store); the leaves' adjoints go to the store's ledger; the
          trajectory's own sum stays unnormalised
close  -> the ledger propagated back through each turn's graph once, last turn first: the
          kept graph (`keep`) or a re-forward of the turn from its stored K/V (`recompute`,
          one extra forward per turn, memory linear in the number of turns)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from thundersync.learner.accumulators import ParamSum
from thundersync.learner.boundary import KV, run_segment
from thundersync.learner.engine_grpo import SourceError, flat_kv, take_grads
from thundersync.learner.kvstore import KVStore
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.objectives import opd_advantages
from thundersync.learner.sources import OpdClose, OpdTurn

if TYPE_CHECKING:
    from thundersync.learner.engine import GradientEngine


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


def turn(e: GradientEngine, item: OpdTurn) -> None:
    t = e.trajs.get(item.traj_id)
    if t is None:  # its own sum, in the accumulator dtype (float64 reaches ~1e-15)
        t = e.trajs[item.traj_id] = Traj(ParamSum(e.spec, e.pool, e.dtype), KVStore(e.pool))
    _check(item, t)
    tokens = torch.tensor(item.token_ids, dtype=torch.long, device=e.device)
    past = t.store.past(t.pos) if t.pos else []
    out = run_segment(e.model, tokens, past=past, start=t.pos, checkpoint=e.checkpoint)
    e.counters["turn_forwards"] += 1
    e.counters["tokens_forward"] += len(tokens)
    mask = torch.tensor(item.action_mask[1:], dtype=torch.bool, device=e.device)
    scored = scored_logprobs(e.model, out.hidden, tokens, mask, chunk=e.logprob_chunk)
    e.mismatch.observe(scored, item.rollout_logprobs)
    teacher = torch.tensor(item.teacher_logprobs, dtype=scored.dtype, device=e.device)
    try:
        adv = opd_advantages(teacher, scored)
    except ValueError as err:
        raise SourceError(f"source {item.source_id}: {err}") from None
    earlier = flat_kv(past)
    if scored.numel():
        e.routed_backward(
            [(t.acc, 1.0)],
            [(adv * scored).sum()],
            leaves=earlier,
            retain_graph=e.keep_turn_graphs,
        )
        with e.bookkeeping():
            t.store.add_adjoint(take_grads(earlier), upto=t.pos)
    t.scored += int(scored.numel())
    kept = (out.kv, past) if e.keep_turn_graphs else None
    t.turns.append(Turn(t.pos, tokens, kept))
    t.store.append([(k.detach(), v.detach()) for k, v in out.kv])
    t.pos += len(tokens)
    t.next_turn += 1


def close(e: GradientEngine, item: OpdClose) -> None:
    t = e.trajs.pop(item.traj_id)
    for j in reversed(range(item.num_turns)):
        tj = t.turns[j]
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
        lg = e.backprop([(t.acc, 1.0)], flat_kv(own), adj, flat_kv(past))
        with e.bookkeeping():
            t.store.add_adjoint(lg, upto=tj.start)
        tj.kept = None  # its graph is spent
        e.counters["deferred_propagations"] += 1
    with e.bookkeeping():
        e.acc.take(t.acc)  # the update owns the trajectory's sum now
    e.acc.scored_tokens += t.scored
    t.store.free()
    t.turns.clear()
    e.closed.add(item.traj_id)
    e.acc.groups_closed += 1
