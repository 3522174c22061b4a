"""The spans topic -> DIR/spans.jsonl, and each update's metrics line from typed learner stats.

Timing of update k (docs/CONTRACTS.md): R = the last source ready (rollout close), L = the
learner's busy time, P = its barrier (reduce + step + publish), all from the update's start; the
idle share is what is left of the step for the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thundersync.bus.events import BarrierStats, Span
from thundersync.bus.protocol import Subscription
from thundersync.config import Objective, RunConfig
from thundersync.driver.emit import UpdateTally
from thundersync.rundir import RunDirWriter


class Timeline:
    """Drains the spans topic: every span to spans.jsonl, rank 0's barrier stats kept by update."""

    def __init__(self, sub: Subscription, files: RunDirWriter) -> None:
        self.sub, self.files = sub, files
        self._barriers: dict[int, BarrierStats] = {}
        self.check_alive: Callable[[str], None] | None = None  # raises when the learner died

    def barrier(self, update: int, timeout_s: float = 30.0) -> BarrierStats | None:
        """Rank 0's stats of `update`: waits up to timeout_s (0: only what has arrived)."""
        deadline = time.time() + timeout_s
        while update not in self._barriers:
            batch = self.sub.receive(timeout_s=0.2 if timeout_s else 0.001, max_count=1024)
            if not batch and self.check_alive is not None:
                self.check_alive(f"the barrier of update {update}")
            for d in batch:
                e = d.event
                self.sub.ack(d)
                if isinstance(e, Span):
                    self.files.write_spans([e.to_jsonl_record()])
                elif isinstance(e, BarrierStats):
                    self.files.write_spans([e.to_span_record()])
                    if e.rank == 0:
                        self._barriers[e.update] = e
            if time.time() >= deadline and not batch:
                return None
        return self._barriers.pop(update)


@dataclass(frozen=True)
class UpdateTimes:
    start: float  # the update opened
    rollout_end: float  # its last source became ready
    end: float  # its metrics are final (the new policy is served, or the step ended)


def update_record(
    cfg: RunConfig,
    update: int,
    times: UpdateTimes,
    tally: UpdateTally,
    stats: BarrierStats | None,
    version: int,
    peak_flops: float | None = None,
) -> dict[str, Any]:
    """`peak_flops`: what MFU divides by (`cfg.mfu_peak_flops` wins when set)."""
    peak = cfg.mfu_peak_flops or peak_flops or 1e11
    step_s = times.end - times.start
    L = stats.busy_s if stats is not None else 0.0
    P = (stats.end - stats.start) if stats is not None else 0.0
    tokens = stats.tokens if stats is not None else 0
    flops = 6.0 * (stats.n_params if stats is not None else 0) * tokens
    rec: dict[str, Any] = {
        "update": update,
        "schedule": cfg.schedule.value,
        "time": times.end,
        "step_s": step_s,
        "rollout_s": times.rollout_end - times.start,
        "learner_busy_s": L,
        "barrier_s": P,
        "idle_share": max(0.0, 1.0 - (L + P) / step_s) if step_s > 0 else 0.0,
        "mfu": flops / (max(L + P, 1e-9) * peak),
        "mfu_wall": flops / (step_s * peak),
        "peak_flops": peak,
        "reward_mean": tally.reward_mean,
        "tokens": tally.tokens,
        "learner_tokens": tokens,
        "sources": tally.sources,
        "bus_p99_ms": stats.bus_p99_ms if stats is not None else 0.0,
        "ready_to_recv_p99_ms": stats.ready_to_recv_p99_ms if stats is not None else 0.0,
        "learner_peak_rss_mb": stats.peak_rss_mb if stats is not None else 0.0,
        "grad_norm": stats.grad_norm if stats is not None else 0.0,
        "max_staleness": stats.max_staleness if stats is not None else 0,
        "logprob_mismatch_mean": stats.logprob_mismatch_mean if stats is not None else 0.0,
        "logprob_mismatch_max": stats.logprob_mismatch_max if stats is not None else 0.0,
        "version": version,
        # rollout.on_failure: drop (driver.failures): failed trajectories dropped, groups
        # dropped whole, and `drop_reasons` {reason: count} when anything was dropped
        "dropped_trajectories": 0,
        "dropped_groups": 0,
    }
    rec.update(tally.drops)
    # named scores (terminal reward.json): score/<name> = mean over the trajectories reporting it
    rec.update({f"score/{k}": sum(v) / len(v) for k, v in sorted(tally.scores.items()) if v})
    if cfg.objective is Objective.OPD:  # the distillation signal (the learner's, all ranks)
        rec["kl_mean"] = stats.kl_mean if stats is not None else 0.0
        rec["distill_loss"] = stats.distill_loss if stats is not None else 0.0
        rec["scored_tokens"] = stats.scored_tokens if stats is not None else 0
    return rec
