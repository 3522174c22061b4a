"""The bus seam: a `Bus` publishes typed events to ordered topics; a `Subscription` receives them
as a member of a consumer group and acks each one only *after* applying it.

Both backends (in-process, Redis Streams) share these semantics so the run driver and the learner
never branch on the backend:
- A topic is one ordered log. Within a consumer group every message goes to one consumer; each group
  sees every message (a group created late still reads from the start of the retained log).
- A received, unacked message stays pending on its consumer. If it stays pending longer than the
  bus's `claim_idle_s` (the consumer crashed or hangs), another consumer of the group claims it and
  gets it again with `redelivered=True`. A consumer restarted under the same name first gets its
  own pending messages back.
- Delivery is therefore at-least-once; `bus.ledger.ExactlyOnce` turns it into apply-exactly-once.
- Set `claim_idle_s` above the longest time a consumer holds a message before acking it, or a
  slow (not dead) consumer's message is handed out a second time while still being applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from thundersync.bus.events import (
    BarrierStats,
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    LearnerReady,
    PolicyPublished,
    ReplicaAcked,
    SourceReady,
    Span,
    TrajectoryAborted,
    TrajectoryRegistered,
)


class Topic(StrEnum):
    LEARNER = "learner"  # sources, registrations, GroupClosed, BatchClosed: one ordered log
    CONTROL = "control"  # PolicyPublished, ReplicaAcked
    SPANS = "spans"  # timeline spans, learner readiness and barrier stats: for the driver


def default_topic(event: Event) -> Topic:
    """Route an event to its topic. Everything the learner's barrier depends on shares one topic, so
    a GroupClosed can never overtake the sources of its group."""
    if isinstance(
        event,
        SourceReady
        | GroupRegistered
        | TrajectoryRegistered
        | GroupClosed
        | BatchClosed
        | TrajectoryAborted,
    ):
        return Topic.LEARNER
    if isinstance(event, PolicyPublished | ReplicaAcked):
        return Topic.CONTROL
    if isinstance(event, Span | LearnerReady | BarrierStats):
        return Topic.SPANS
    raise TypeError(f"no topic for event type {type(event).__name__}")


class BusError(RuntimeError):
    """A bus failure phrased for the user (what failed, and what to check)."""


@dataclass(frozen=True)
class Delivery:
    """One received message: ack it with `Subscription.ack` once its effect is applied."""

    message_id: str
    topic: str
    event: Event
    redelivered: bool = False


@runtime_checkable
class Subscription(Protocol):
    topic: str
    group: str
    consumer: str

    def receive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        """Block up to timeout_s for messages; returns [] on timeout."""
        ...

    async def areceive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        """`receive` for asyncio code (does not block the event loop)."""
        ...

    def ack(self, *deliveries: Delivery) -> None:
        """Mark deliveries applied: they will never be delivered again."""
        ...

    def pending(self) -> int:
        """Messages of this consumer received but not yet acked."""
        ...

    def close(self) -> None:
        """Stop receiving; unacked messages stay pending and can be claimed by others."""
        ...


@runtime_checkable
class Bus(Protocol):
    def publish(self, event: Event, topic: str | None = None) -> str:
        """Append an event to its topic (default: `default_topic`); returns the message id."""
        ...

    def subscribe(self, topic: str, group: str, consumer: str) -> Subscription:
        """Join (creating if needed) a consumer group of a topic as the named consumer."""
        ...

    def close(self) -> None: ...
