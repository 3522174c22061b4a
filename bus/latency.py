"""Publish -> consumer-receive latency of a bus backend (the `tsrl bench bus` measurement).

A consumer thread blocks in `receive`; the main thread publishes small sources
(`GrpoTrajectoryReady`) at a fixed pace, each stamped with its creation time; the consumer records now - emitted_at on arrival
(same host, same clock). Paced publishing measures the latency a ready source sees on an idle bus,
which is what the learner's "ready -> learner start" budget is about, not throughput.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from thundersync.bus.events import GrpoTrajectoryReady
from thundersync.bus.protocol import Bus


@dataclass(frozen=True)
class LatencyStats:
    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    if not values:
        raise ValueError("percentile of an empty list")
    s = sorted(values)
    rank = max(1, min(len(s), int(-(-q * len(s) // 100))))
    return s[rank - 1]


def _event(run_id: str, i: int) -> GrpoTrajectoryReady:
    return GrpoTrajectoryReady(
        run_id=run_id,
        source_id=f"{run_id}-{i}",
        update=0,
        policy_version=0,
        group_id=f"g{i // 8}",
        traj_id=f"t{i}",
        index=i % 8,
        token_ids=list(range(64)),
        action_mask=[0] * 16 + [1] * 48,
    )


def measure_latency(bus: Bus, n: int = 500, interval_s: float = 0.001) -> LatencyStats:
    run_id = uuid.uuid4().hex[:8]
    topic = f"latency-{run_id}"
    sub = bus.subscribe(topic, group="bench", consumer="c0")
    lat_ms: list[float] = []
    done = threading.Event()

    def consume() -> None:
        while len(lat_ms) < n and not done.is_set():
            for d in sub.receive(timeout_s=0.5):
                lat_ms.append((time.time() - d.event.emitted_at) * 1000.0)
                sub.ack(d)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for i in range(n):
        bus.publish(_event(run_id, i), topic)
        time.sleep(interval_s)
    t.join(timeout=30.0)
    done.set()
    sub.close()
    if len(lat_ms) < n:
        raise RuntimeError(f"only {len(lat_ms)} of {n} events arrived within 30 s")
    return LatencyStats(n, percentile(lat_ms, 50), percentile(lat_ms, 99), max(lat_ms))
