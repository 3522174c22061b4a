"""What the learner process measures during one update, and its `BarrierStats` event."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

import torch

from thundersync.bus.events import BarrierStats, GroupRegistered, SourceReady, TrajectoryAborted
from thundersync.learner.barrier import StepStats
from thundersync.learner.engine import GradientEngine
from thundersync.learner.parallel import ParallelContext


@dataclass
class UpdateState:
    engine: GradientEngine
    busy_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    bus_latencies: list[float] = field(default_factory=list)
    logged: list[GroupRegistered | SourceReady] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    shrunk: dict[str, int] = field(default_factory=dict)  # GRPO group -> members dropped
    max_staleness: int = 0

    def received(self, ev: SourceReady, version: int, *, log: bool) -> None:
        self.latencies.append(time.time() - ev.ready_at)
        self.max_staleness = max(self.max_staleness, version - ev.policy_version)
        if log:
            self.logged.append(ev)

    def registered(self, ev: GroupRegistered, *, log: bool) -> None:
        if log:  # the replay takes each group's prompt and size from here
            self.logged.append(ev)

    def dropped(self, ev: TrajectoryAborted, *, whole: bool) -> None:
        """A dropped trajectory (`rollout.on_failure: drop`): the log becomes the masked batch
        (a group dropped whole, an OPD trajectory, leave it; a GRPO group logs its new size)."""
        if whole:
            self.aborted.add(ev.group_id)
        else:
            self.shrunk[ev.group_id] = self.shrunk.get(ev.group_id, 0) + 1

    def kept_log(self) -> list[str]:
        """The batch log: every group registration and source received, but the sources of
        aborted trajectories and of groups dropped whole; a shrunk group with its final size."""
        out = []
        for e in self.logged:
            if isinstance(e, GroupRegistered):
                if e.group_id in self.aborted:
                    continue
                if e.group_id in self.shrunk:
                    e = e.model_copy(update={"size": e.size - self.shrunk[e.group_id]})
            elif e.traj_id in self.aborted or e.group_id in self.aborted:
                continue
            out.append(e.model_dump_json())
        return out

    def barrier_stats(
        self,
        *,
        run_id: str,
        update: int,
        rank: int,
        step: StepStats,
        start: float,
        end: float,
        n_params: int,
        distill_ctx: ParallelContext | None = None,
    ) -> BarrierStats:
        """`distill_ctx`: an OPD run's ranks (every rank calls this: the KL sums are
        all-reduced); None for GRPO."""
        c = self.engine.counters
        kl, loss, n = distill_totals(self.engine, distill_ctx)
        return BarrierStats(
            run_id=run_id,
            update=update,
            rank=rank,
            version=step.version,
            start=start,
            end=end,
            busy_s=self.busy_s,
            reduce_s=step.reduce_s,
            step_s=step.step_s,
            publish_s=step.publish_s,
            tokens=c["tokens_forward"],
            work_items=c["work_items"],
            grad_norm=step.grad_norm,
            ready_to_recv_p99_ms=1000 * _p99(self.latencies),
            bus_p99_ms=1000 * _p99(self.bus_latencies),
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            n_params=n_params,
            max_staleness=self.max_staleness,
            logprob_mismatch_mean=self.engine.mismatch.mean,
            logprob_mismatch_max=self.engine.mismatch.max,
            logprob_tokens=self.engine.mismatch.tokens,
            kl_mean=kl / n if n else 0.0,
            distill_loss=loss / n if n else 0.0,
            scored_tokens=n,
        )


def distill_totals(engine: GradientEngine, ctx: ParallelContext | None) -> tuple[float, float, int]:
    """(KL sum, surrogate loss sum, scored tokens) of the update over all ranks: a separate
    float64 all-reduce after the step, so the step's own reduce is untouched."""
    if ctx is None:
        return 0.0, 0.0, 0
    d = engine.opd.stats
    sums = torch.tensor([d.kl_sum, d.loss_sum, float(d.tokens)], dtype=torch.float64)
    ctx.all_reduce_sum(sums)
    return float(sums[0]), float(sums[1]), int(sums[2])


def _p99(xs: list[float]) -> float:
    s = sorted(xs) or [0.0]
    return s[min(len(s) - 1, int(0.99 * len(s)))]
