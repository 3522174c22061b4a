"""Shared helpers of the bus tests (imported by module name: tests/ has no packages)."""

from __future__ import annotations

from thundersync.bus.events import GrpoTrajectoryReady
from thundersync.bus.protocol import Delivery, Subscription

REDIS_URL = "redis://127.0.0.1:6379/0"
CLAIM_IDLE_S = 0.2


def source(i: int, run_id: str = "run", source_id: str | None = None) -> GrpoTrajectoryReady:
    return GrpoTrajectoryReady(
        run_id=run_id,
        source_id=source_id or f"s{i}",
        update=0,
        policy_version=0,
        group_id=f"g{i // 4}",
        traj_id=f"t{i}",
        index=i % 4,
        token_ids=[3, i],
        action_mask=[1, 1],
    )


def drain(sub: Subscription, n: int, timeout_s: float = 10.0, ack: bool = True) -> list[Delivery]:
    """Receive until n deliveries arrived (or a generous timeout passed)."""
    import time

    out: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        got = sub.receive(timeout_s=0.5, max_count=n - len(out))
        if ack and got:
            sub.ack(*got)
        out += got
    return out
