"""The per-rank gradient engine of one update: applies released sources as soon as it may.

Reads like the maths in docs/DESIGN.md (the work items in `engine_grpo` / `engine_opd`):
  GRPO content i  -> H_i at theta_k, the prompt K/V as leaves; G2 += H_i, G1 += (r_i - c) H_i
  group close     -> g_G = (alpha G1 + beta G2) / m, its prompt-leaf part through the prompt once
  OPD turn j      -> grad of sum_t A_jt log pi over turn j, earlier turns' K/V as leaves
  OPD close       -> the leaves' ledger propagated back through the turns once, last turn first
Nothing here normalises, reduces across ranks or steps: that is the barrier's job.

Admission: a new group / trajectory opens only while fewer than `max_open_groups` are open and,
with `max_held_bytes`, while what the engine holds (accumulators, held gradients, K/V stores,
counted by the buffer pool) leaves room for the full-size vectors it needs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from thundersync.config import Estimator, Schedule
from thundersync.learner import engine_grpo, engine_opd
from thundersync.learner.accumulators import BufferPool, FlatSpec
from thundersync.learner.engine_grpo import Group, SourceError, take_grads
from thundersync.learner.engine_opd import Traj
from thundersync.learner.logprobs import LogprobMismatch
from thundersync.learner.routing import GradRouter, GradSink, Target
from thundersync.learner.sources import (
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
        max_open_groups: int = 4,
        max_held_bytes: int | None = None,
        accum_dtype: torch.dtype = torch.float32,
        accum_device: torch.device | str = "cpu",
        checkpoint: bool = False,
        keep_turn_graphs: bool = True,
        logprob_chunk: int = 1024,
        pool: BufferPool | None = None,
        router: GradRouter | None = None,
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
        self.max_held_bytes = max_held_bytes
        self.dtype = accum_dtype
        self.checkpoint = checkpoint
        self.keep_turn_graphs = keep_turn_graphs
        self.logprob_chunk = logprob_chunk
        self.pool = pool or BufferPool(self.acc_device, pin=self.device.type == "cuda")
        self.router = router or GradRouter(
            params, GradSink(self.spec, self.acc_device, accum_dtype)
        )
        # the update's sum spans groups closing in any order (sync closes them one by one,
        # stream as they finish): fp64 keeps it order-free; one add per group / trajectory close
        self.acc = UpdateAccumulator(self.spec, self.pool, torch.float64)
        self.queue = ReadyQueue()
        self.releaser = Releaser(schedule, self.queue)
        self.group_specs: dict[str, GrpoGroupSpec] = {}
        self.groups: dict[str, Group] = {}
        self.trajs: dict[str, Traj] = {}
        self.expected_trajs: set[str] = set()
        self.closed: set[str] = set()
        self.pending_rewards: dict[str, dict[int, float]] = {}
        self.applied: set[str] = set()
        self.counters: Counter[str] = Counter()
        self.mismatch = LogprobMismatch()
        # seconds: "backward" includes the routed adds, "bookkeeping" the rest of the vector work
        self.timers: dict[str, float] = {"bookkeeping": 0.0, "backward": 0.0}
        self.peak_open = 0

    @contextmanager
    def bookkeeping(self) -> Iterator[None]:
        """Times the full-parameter vector work (what streaming adds over a plain backward)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timers["bookkeeping"] += time.perf_counter() - t0

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
        if key in self.groups or key in self.trajs:
            return True
        return self._open_count() < self.max_open and self._bytes_allow(item)

    def _bytes_allow(self, item: WorkItem) -> bool:
        """Room for a new group's G1 + G2 (a trajectory's own sum) within `max_held_bytes`.

        With nothing open the item is always admitted: refusing it could never make room."""
        if self.max_held_bytes is None or self._open_count() == 0:
            return True
        vectors = 2 if isinstance(item, GrpoContent) else 1
        need = vectors * self.spec.total * torch.empty((), dtype=self.dtype).element_size()
        ok = self.pool.held_bytes + need <= self.max_held_bytes
        if not ok:
            self.counters["admission_bytes_waits"] += 1
        return ok

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
            engine_grpo.content(self, item)
        elif isinstance(item, GrpoReward):
            engine_grpo.reward(self, item)
        elif isinstance(item, OpdTurn):
            engine_opd.turn(self, item)
        else:
            engine_opd.close(self, item)
        self.counters["work_items"] += 1
        self.peak_open = max(self.peak_open, self._open_count())
        return item

    def drain(self) -> int:
        n = 0
        while self.step_one() is not None:
            n += 1
        return n

    def backprop(
        self,
        targets: list[Target],
        outs: list[torch.Tensor],
        adj: list[torch.Tensor],
        leaves: list[torch.Tensor],
    ) -> list[torch.Tensor | None]:
        """Push `adj` back through `outs` into the parameter sums `targets`; returns the
        adjoints of `leaves` (earlier K/V). Frozen outputs (LoRA) are skipped."""
        pairs = [
            (o, a.to(device=o.device, dtype=o.dtype))
            for o, a in zip(outs, adj, strict=True)
            if o.requires_grad
        ]
        if not pairs:
            return [None for _ in leaves]
        self.routed_backward(targets, [o for o, _ in pairs], [a for _, a in pairs], leaves=leaves)
        return take_grads(leaves)

    def routed_backward(
        self,
        targets: list[Target],
        outputs: list[torch.Tensor],
        grad_outputs: list[torch.Tensor] | None = None,
        *,
        leaves: list[torch.Tensor],
        retain_graph: bool = False,
    ) -> None:
        """One backward whose parameter gradients go straight into `targets` (in place)."""
        t0 = time.perf_counter()
        self.router.backward(
            targets,
            outputs,
            grad_outputs,
            inputs=[*self.params, *leaves],
            retain_graph=retain_graph,
        )
        self.timers["backward"] += time.perf_counter() - t0

    def abort(self, key: str) -> None:
        """Drop a group / trajectory whose rollout failed: none of its work reaches the update.

        Its sources already applied are discarded with it (they live in the group's G1/G2 or the
        trajectory's own sum until close); the rerun comes back under a new key.
        """
        if key in self.closed:
            raise SourceError(f"{key} already closed: its gradient is in the update; cannot abort")
        g = self.groups.pop(key, None)
        if g is not None:
            g.free()
        t = self.trajs.pop(key, None)
        if t is not None:
            t.free()
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
