"""Logged batches and their replay through a schedule (the paper's App. G protocol).

A logged batch is everything the learner saw in one update: tokens, masks, rewards or teacher
log-probs, and the time each source became ready. Replaying it through sync / group / stream with
the same theta_0 must give the same parameters; a shuffled arrival order must too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from thundersync.config import Objective, Schedule
from thundersync.learner.barrier import StepStats
from thundersync.learner.engine import GradientEngine
from thundersync.learner.parallel import ParallelContext
from thundersync.learner.sources import (
    Dropped,
    GrpoContent,
    GrpoGroupSpec,
    GrpoReward,
    OpdClose,
    OpdTurn,
    WorkItem,
)
from thundersync.learner.trainer import Learner


@dataclass
class LoggedBatch:
    objective: Objective
    groups: list[GrpoGroupSpec] = field(default_factory=list)
    trajectories: list[str] = field(default_factory=list)
    events: list[tuple[float, WorkItem | Dropped]] = field(default_factory=list)

    def owner_index(self, item: WorkItem | Dropped) -> int:
        keys = [g.group_id for g in self.groups] or self.trajectories
        return keys.index(item.key)

    def shuffled(self, seed: int) -> LoggedBatch:
        """Same sources, other ready times (per-trajectory order of OPD turns kept)."""
        rng = random.Random(seed)
        times = [t for t, _ in self.events]
        rng.shuffle(times)
        ev = [(t, it) for t, (_, it) in zip(times, self.events, strict=True)]
        return LoggedBatch(self.objective, self.groups, self.trajectories, sorted(ev, key=_k))

    def with_drops(self, drops: list[tuple[str, int | None]], at: float) -> LoggedBatch:
        """This batch as a run where each (group, member) / (OPD trajectory, None) failed and was
        dropped at time `at`: a GRPO member's sources never come (its failure precedes its
        reward), an OPD trajectory's turns come but its close does not."""
        gone = set(drops)
        events: list[tuple[float, WorkItem | Dropped]] = []
        for t, it in self.events:
            if isinstance(it, GrpoContent | GrpoReward) and (it.group_id, it.index) in gone:
                continue
            if isinstance(it, OpdClose) and (it.traj_id, None) in gone:
                continue
            events.append((t, it))
        events += [(at, Dropped(f"{k}/{i}/dropped", k, i)) for k, i in drops]
        return LoggedBatch(self.objective, self.groups, self.trajectories, sorted(events, key=_k))

    def masked(self, min_size: int = 2) -> LoggedBatch:
        """The batch sync training sees once its dropped rows are masked: no `Dropped` events,
        no dropped OPD trajectory, each GRPO group without its dropped members (the rest
        renumbered 0..m'-1 in their order) or, left below `min_size` (or empty), without the
        group. What the engine must equal when it replays this batch with its drops."""
        drops = [it for _, it in self.events if isinstance(it, Dropped)]
        gone_traj = {d.key for d in drops if d.index is None}
        lost: dict[str, set[int]] = {}
        for d in drops:
            if d.index is not None:
                lost.setdefault(d.key, set()).add(d.index)
        groups, renumber = [], {}
        for g in self.groups:
            seen = {
                it.index
                for _, it in self.events
                if isinstance(it, GrpoContent | GrpoReward) and it.group_id == g.group_id
            }
            keep = sorted(seen - lost.get(g.group_id, set()))
            if len(keep) < min(min_size, g.size) or not keep:
                continue
            groups.append(replace(g, size=len(keep)))
            renumber[g.group_id] = {old: new for new, old in enumerate(keep)}
        events: list[tuple[float, WorkItem | Dropped]] = []
        for t, it in self.events:
            if isinstance(it, Dropped) or it.key in gone_traj:
                continue
            if isinstance(it, GrpoContent | GrpoReward):
                idx = renumber.get(it.group_id, {}).get(it.index)
                if idx is None:
                    continue
                it = replace(it, index=idx)
            events.append((t, it))
        trajs = [t for t in self.trajectories if t not in gone_traj]
        return LoggedBatch(self.objective, groups, trajs, events)


def _k(e: tuple[float, WorkItem | Dropped]) -> float:
    return e[0]


def replay_update(
    learner: Learner, batch: LoggedBatch, schedule: Schedule, ctx: ParallelContext | None = None
) -> StepStats:
    return learner.step(replay_sources(learner, batch, schedule, ctx))


def replay_sources(
    learner: Learner, batch: LoggedBatch, schedule: Schedule, ctx: ParallelContext | None = None
) -> GradientEngine:
    """Every source of `batch` applied (in ready order) to a fresh engine; no step yet."""
    ctx = ctx or learner.ctx
    engine = learner.open_update(schedule)
    for gi, g in enumerate(batch.groups):
        if ctx.owns(gi):
            engine.register_group(g)
    for ti, tid in enumerate(batch.trajectories):
        if ctx.owns(ti):
            engine.register_trajectory(tid)
    for ready, item in sorted(batch.events, key=_k):
        if not ctx.owns(batch.owner_index(item)):
            continue
        if isinstance(item, Dropped):
            engine.drop(item)
        else:
            engine.submit(item, ready)
        engine.drain()
    engine.close_batch()
    engine.drain()
    return engine


def make_grpo_batch(
    rng: random.Random,
    *,
    vocab: int,
    groups: int = 2,
    group_size: int = 8,
    reward_offset: float = 0.0,
    tag: str = "",
) -> LoggedBatch:
    b = LoggedBatch(Objective.GRPO)
    for gi in range(groups):
        gid = f"{tag}g{gi}"
        prompt = tuple(rng.randrange(8, vocab) for _ in range(rng.randint(4, 16)))
        b.groups.append(GrpoGroupSpec(gid, prompt, group_size))
        for i in range(group_size):
            n = rng.randint(2, 24)
            resp = tuple(rng.randrange(8, vocab) for _ in range(n))
            # tool observations inside a response are not scored
            mask = tuple(0 if rng.random() < 0.2 else 1 for _ in range(n))
            t_content = rng.uniform(0, 10)
            b.events.append((t_content, GrpoContent(f"{gid}/t{i}", gid, i, resp, mask)))
            r = reward_offset + rng.choice([0.0, 1.0]) + rng.gauss(0, 0.3)
            b.events.append((t_content + rng.uniform(0, 3), GrpoReward(f"{gid}/r{i}", gid, i, r)))
    b.events.sort(key=_k)
    return b


def make_opd_batch(
    rng: random.Random,
    teacher: nn.Module,
    *,
    vocab: int,
    trajectories: int = 4,
    tag: str = "",
) -> LoggedBatch:
    """OPD trajectories of >= 3 turns; teacher log-probs from a real (tiny) teacher forward."""
    b = LoggedBatch(Objective.OPD)
    for ti in range(trajectories):
        tid = f"{tag}o{ti}"
        b.trajectories.append(tid)
        segments: list[tuple[list[int], list[int]]] = []
        for j in range(rng.randint(3, 4)):
            ctx_len = rng.randint(4, 10) if j == 0 else rng.randint(1, 5)
            act_len = rng.randint(2, 10)
            toks = [rng.randrange(8, vocab) for _ in range(ctx_len + act_len)]
            segments.append((toks, [0] * ctx_len + [1] * act_len))
        full = torch.tensor([t for s, _ in segments for t in s])
        mask = torch.tensor([m for _, ms in segments for m in ms], dtype=torch.bool)
        with torch.no_grad():
            logits = teacher(input_ids=full.view(1, -1)).logits[0, :-1]
            lp = torch.log_softmax(logits.double(), -1).gather(-1, full[1:].view(-1, 1))[:, 0]
        t_lp = lp[mask[1:]].tolist()
        t = rng.uniform(0, 2)
        k = 0
        for j, (toks, ms) in enumerate(segments):
            n = sum(ms)
            t += rng.uniform(0.5, 3)
            turn = OpdTurn(f"{tid}/turn{j}", tid, j, tuple(toks), tuple(ms), tuple(t_lp[k : k + n]))
            b.events.append((t, turn))
            k += n
        b.events.append((t + rng.uniform(0, 1), OpdClose(f"{tid}/close", tid, len(segments))))
    b.events.sort(key=_k)
    return b
