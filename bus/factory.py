"""One factory over the three bus backends, and the rules for which one a run may use.

- `inproc`: every event stays inside one interpreter (tests, benchmarks in one process).
- `process`: the embedded run; driver and learner processes on one machine, over multiprocessing
  queues whose routes are fixed before the learner is spawned (`bus.mp`).
- `redis`: Redis Streams, for learners in other processes or on other nodes (Ray placement).

A run's learner always lives in another process, so `inproc` cannot carry a run, and a Ray actor
cannot reach the process bus's queues: `run_bus_kind` says so at once, with the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from thundersync.bus.protocol import Bus, BusError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
RUN_STREAM_TTL_S = 24 * 3600  # a dead run's streams are gone a day after its last event


class BusKind(StrEnum):
    INPROC = "inproc"
    PROCESS = "process"
    REDIS = "redis"


def make_bus(
    kind: BusKind | str,
    *,
    url: str = DEFAULT_REDIS_URL,
    prefix: str = "tsrl",
    claim_idle_s: float = 30.0,
    learner_ranks: int = 1,
    expire_s: int | None = None,
) -> Bus:
    """Build a backend by name; `learner_ranks` fixes the process bus's routes; `expire_s` bounds
    how long a broker keeps the streams after their last publish."""
    kind = BusKind(kind)
    if kind is BusKind.INPROC:
        from thundersync.bus.inproc import InProcessBus

        return InProcessBus(claim_idle_s=claim_idle_s)
    if kind is BusKind.PROCESS:
        from thundersync.bus.mp import ProcessBus, learner_routes

        return ProcessBus(learner_routes(learner_ranks))
    from thundersync.bus.redis_streams import RedisStreamsBus

    return RedisStreamsBus(url=url, prefix=prefix, claim_idle_s=claim_idle_s, expire_s=expire_s)


def run_bus_kind(requested: BusKind | str | None, *, on_ray: bool) -> BusKind:
    """The bus a run uses: the default for its placement, or the requested one if it can work."""
    if requested is None:
        return BusKind.REDIS if on_ray else BusKind.PROCESS
    kind = BusKind(requested)
    if kind is BusKind.INPROC:
        raise BusError(
            "--bus inproc keeps every event inside one process, but a run's learner runs in a "
            "process of its own: use --bus process (the default) or --bus redis"
        )
    if on_ray and kind is not BusKind.REDIS:
        raise BusError(
            f"Ray placement needs a broker that every node reaches, not the {kind.value} bus: "
            "use --bus redis (TSRL_REDIS_URL names the broker)"
        )
    return kind


@dataclass(frozen=True)
class BusRef:
    """How a spawned process or a Ray actor reaches a broker-backed bus (a client cannot be
    pickled, a reference can)."""

    kind: BusKind
    prefix: str
    url: str = DEFAULT_REDIS_URL
    expire_s: int | None = RUN_STREAM_TTL_S

    def connect(self) -> Bus:
        return make_bus(self.kind, url=self.url, prefix=self.prefix, expire_s=self.expire_s)


def open_run_bus(kind: BusKind, *, run_id: str, learner_ranks: int) -> tuple[Bus, Bus | BusRef]:
    """(the driver's bus, what the learner processes are handed to reach it).

    The process bus crosses the spawn boundary itself (its queues are inherited); a broker is
    reached by reference, under a prefix of its own per run.
    """
    if kind is BusKind.PROCESS:
        bus = make_bus(kind, learner_ranks=learner_ranks)
        return bus, bus
    if kind is BusKind.REDIS:
        ref = BusRef(
            kind, prefix=f"tsrl:{run_id}", url=os.environ.get("TSRL_REDIS_URL", DEFAULT_REDIS_URL)
        )
        return ref.connect(), ref
    raise BusError(f"a run cannot use the {kind.value} bus: use process or redis")


def connect(handle: Bus | BusRef) -> Bus:
    """The learner side of `open_run_bus`."""
    return handle.connect() if isinstance(handle, BusRef) else handle
