"""The per-rank gradient engine of one update: applies released sources as soon as it may.

Reads like the maths in docs/DESIGN.md (the work items in `engine_grpo` / `engine_opd`):
  GRPO content i  -> H_i at theta_k, the prompt K/V as leaves; G2 += H_i, G1 += (r_i - c) H_i
  group close     -> g_G = (alpha G1 + beta G2) / m, its prompt-leaf part through the prompt once
  OPD turn j      -> grad of sum_t A_jt log pi over turn j, earlier turns' K/V as leaves
  OPD close       -> the leaves' ledger propagated back through the turns once, last turn first
Nothing here normalises, reduces across ranks or steps: that is the barrier's job.

The engine owns the release (schedule, ready queue), admission and dispatch; the GRPO groups and
OPD trajectories own their open state; both run on one `EngineCore` (model, sums, backward).
Admission: a new group / trajectory opens only while fewer than `max_open_groups` are open and,
with `max_held_bytes`, while what the engine holds (accumulators, held gradients, K/V stores,
counted by the buffer pool) leaves room for the full-size vectors it needs.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from thundersync.config import Checkpointing, Estimator, GroupReduction, GrpoSum, Schedule
from thundersync.learner.accumulators import BufferPool, FlatSpec
from thundersync.learner.engine_core import EngineCore, SourceError
from thundersync.learner.engine_grpo import GrpoGroups
from thundersync.learner.engine_opd import OpdTrajectories
from thundersync.learner.logprobs import LogprobMismatch
from thundersync.learner.routing import GradRouter
from thundersync.learner.sources import (
    Dropped,
    GrpoContent,
    GrpoGroupSpec,
    GrpoReward,
    OpdClose,
    OpdTurn,
    ReadyQueue,
    Releaser,
    WorkItem,
)
from thundersync.learner.update_sum import UpdateAccumulator

__all__ = ["GradientEngine", "SourceError"]


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
        group_reduction: GroupReduction = GroupReduction.SUM,
        grpo_sum: GrpoSum = GrpoSum.ARRIVAL,
        reward_shift: float | None = None,
        max_open_groups: int = 4,
        max_held_bytes: int | None = None,
        accum_dtype: torch.dtype = torch.float32,
        accum_device: torch.device | str = "cpu",
        checkpoint: Checkpointing | bool = False,
        keep_turn_graphs: bool = True,
        logprob_chunk: int = 1024,
        pool: BufferPool | None = None,
        router: GradRouter | None = None,
        kv_limit: int | None = None,
        opd_segment_tokens: int | None = None,
    ) -> None:
        self.core = EngineCore(
            model,
            params,
            accum_dtype=accum_dtype,
            accum_device=accum_device,
            checkpoint=checkpoint,
            logprob_chunk=logprob_chunk,
            pool=pool,
            router=router,
            kv_limit=kv_limit,
        )
        self.grpo = GrpoGroups(
            self.core,
            estimator=estimator,
            std_eps=std_eps,
            token_weighting=token_weighting,
            per_token=group_reduction is GroupReduction.TOKEN_MEAN,
            grpo_sum=grpo_sum,
            reward_shift=reward_shift,
        )
        self.opd = OpdTrajectories(
            self.core, keep_turn_graphs=keep_turn_graphs, segment_tokens=opd_segment_tokens
        )
        self.max_open = max_open_groups
        self.max_held_bytes = max_held_bytes
        self.queue = ReadyQueue()
        self.releaser = Releaser(schedule, self.queue)
        self.applied: set[str] = set()
        self.dropped: set[str] = set()  # groups / trajectories dropped whole: late sources ignored
        self.peak_open = 0

    # ---- what the barrier, the learner's stats and the benches read (the core's) -----------
    @property
    def acc(self) -> UpdateAccumulator:
        return self.core.acc

    @property
    def pool(self) -> BufferPool:
        return self.core.pool

    @property
    def spec(self) -> FlatSpec:
        return self.core.spec

    @property
    def counters(self) -> Counter[str]:
        return self.core.counters

    @property
    def mismatch(self) -> LogprobMismatch:
        return self.core.mismatch

    @property
    def timers(self) -> dict[str, float]:
        return self.core.timers

    @property
    def group_specs(self) -> dict[str, GrpoGroupSpec]:
        return self.grpo.specs

    # ---- registration and submission -------------------------------------------------------
    def register_group(self, spec: GrpoGroupSpec) -> None:
        self.grpo.register(spec)
        self.releaser.expect_group(spec.group_id, spec.size)

    def register_trajectory(self, traj_id: str) -> None:
        self.opd.register(traj_id)

    def submit(self, item: WorkItem, ready: float) -> None:
        if item.key in self.dropped:
            self.counters["dropped_late_sources"] += 1
            return
        if isinstance(item, GrpoContent | GrpoReward) and item.group_id not in self.grpo.specs:
            raise SourceError(f"source {item.source_id}: group {item.group_id!r} is not registered")
        if isinstance(item, OpdTurn | OpdClose) and item.traj_id not in self.opd.expected:
            raise SourceError(
                f"source {item.source_id}: trajectory {item.traj_id!r} not registered"
            )
        self.releaser.submit(item, ready)

    def close_batch(self, now: float = float("inf")) -> None:
        self.releaser.close_batch(now)

    # ---- the ready queue -------------------------------------------------------------------
    def _admissible(self, item: WorkItem) -> bool:
        if isinstance(item, GrpoReward):
            # binding a reward allocates nothing, but it never overtakes its group's earlier
            # content: a group's sums then see its sources in queue order whether or not the
            # group waited for admission, so stream == sync bitwise for any max_open_groups
            return not self.queue.queued_before(item)
        if isinstance(item, OpdTurn | OpdClose) and not self.opd.in_order(item):
            return False
        if isinstance(item, OpdClose) or self._is_open(item.key):
            return True
        return self._open_count() < self.max_open and self._bytes_allow(item)

    def _bytes_allow(self, item: WorkItem) -> bool:
        """Room for a new group's G1 + G2 (a trajectory's own sum) within `max_held_bytes`.

        With nothing open the item is always admitted: refusing it could never make room."""
        if self.max_held_bytes is None or self._open_count() == 0:
            return True
        c = self.core
        vectors, dtype = (2, self.grpo.dtype) if isinstance(item, GrpoContent) else (1, c.dtype)
        need = vectors * c.spec.total * torch.empty((), dtype=dtype).element_size()
        ok = c.pool.held_bytes + need <= self.max_held_bytes
        if not ok:
            c.counters["admission_bytes_waits"] += 1
        return ok

    def _is_open(self, key: str) -> bool:
        return self.grpo.is_open(key) or self.opd.is_open(key)

    def _open_count(self) -> int:
        return len(self.grpo.groups) + len(self.opd.trajs)

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
            self.grpo.content(item)
        elif isinstance(item, GrpoReward):
            self.grpo.reward(item)
        elif isinstance(item, OpdTurn):
            self.opd.turn(item)
        else:
            self.opd.close(item)
        self.counters["work_items"] += 1
        self.peak_open = max(self.peak_open, self._open_count())
        return item

    def drain(self) -> int:
        n = 0
        while self.step_one() is not None:
            n += 1
        return n

    def abort(self, key: str) -> None:
        """Drop a group / trajectory whose rollout failed: none of its work reaches the update.

        Its sources already applied are discarded with it (they live in the group's G1/G2 or the
        trajectory's own sum until close); the rerun comes back under a new key.
        """
        if key in self.grpo.closed or key in self.opd.closed:
            raise SourceError(f"{key} already closed: its gradient is in the update; cannot abort")
        self.grpo.abort(key)
        self.opd.abort(key)
        self.releaser.drop(key)
        self.queue.drop(key)
        self.counters["aborted"] += 1

    def drop(self, d: Dropped) -> None:
        """A trajectory dropped after an infra failure (`rollout.on_failure: drop`): the update
        becomes sync training on the batch without that row. GRPO (`d.index` set): the group
        closes over its other members; below the estimator's minimum it is dropped whole, with
        whatever it had applied. OPD: the trajectory and its applied turns are forgotten."""
        if d.key in self.dropped:
            return  # its group was already dropped whole
        if d.index is None:
            self.abort(d.key)
            self.counters["aborted"] -= 1  # counted as a drop, not as a rerun's abort
            self.dropped.add(d.key)
            self.counters["dropped_trajectories"] += 1
            return
        if d.key in self.grpo.closed:
            raise SourceError(f"drop of {d.key}[{d.index}]: the group already closed")
        self.counters["dropped_trajectories"] += 1
        if self.grpo.drop_member(d.key, d.index):
            self.releaser.drop(d.key)
            self.queue.drop(d.key)
            self.dropped.add(d.key)
            self.counters["dropped_groups"] += 1
        elif d.key not in self.grpo.closed:
            self.releaser.resize(d.key, self.grpo.specs[d.key].size)

    # ---- barrier support -------------------------------------------------------------------
    def open_sources(self) -> list[str]:
        """Every reason this update cannot step yet (empty when it can)."""
        why = []
        if len(self.queue):
            why.append(f"{len(self.queue)} released sources not yet applied")
        held = sum(len(v) for v in self.releaser._held.values())
        if held:
            why.append(f"{held} sources held by the {self.releaser.schedule.value} schedule")
        why += [f"group {gid} open" for gid in self.grpo.groups]
        why += [f"trajectory {tid} open" for tid in self.opd.trajs]
        missing = self.grpo.unclosed() | self.opd.unclosed()
        why += [f"{key} registered but never closed" for key in sorted(missing)]
        return why
