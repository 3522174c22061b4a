"""What the learner process measures during one update, and its `BarrierStats` event."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

from thundersync.bus.events import BarrierStats, SourceReady
from thundersync.learner.barrier import StepStats
from thundersync.learner.engine import GradientEngine


@dataclass
class UpdateState:
    engine: GradientEngine
    sizes: dict[str, int] = field(default_factory=dict)
    busy_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    bus_latencies: list[float] = field(default_factory=list)
    logged: list[SourceReady] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    max_staleness: int = 0

    def received(self, ev: SourceReady, version: int, *, log: bool) -> None:
        self.latencies.append(time.time() - ev.ready_at)
        self.max_staleness = max(self.max_staleness, version - ev.policy_version)
        if log:
            self.logged.append(ev)

    def kept_log(self) -> list[str]:
        """The batch log: every source received, but those of aborted trajectories."""
        return [e.model_dump_json() for e in self.logged if e.traj_id not in self.aborted]

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
    ) -> BarrierStats:
        c = self.engine.counters
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
        )


def _p99(xs: list[float]) -> float:
    s = sorted(xs) or [0.0]
    return s[min(len(s) - 1, int(0.99 * len(s)))]
