"""The event bus: typed events (`bus.events`), the Bus / Subscription seam (`bus.protocol`), an
in-process backend (`bus.inproc`, the embedded default) and Redis Streams (`bus.redis_streams`),
plus apply-exactly-once on top of at-least-once delivery (`bus.ledger`)."""

from bus.events import (
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    PolicyPublished,
    ReplicaAcked,
    Role,
    SourceKind,
    SourceReady,
    Span,
    decode_event,
    encode_event,
)
from bus.protocol import Bus, BusError, BusKind, Delivery, Subscription, Topic, make_bus

__all__ = [
    "BatchClosed",
    "Bus",
    "BusError",
    "BusKind",
    "Delivery",
    "Event",
    "GroupClosed",
    "GroupRegistered",
    "PolicyPublished",
    "ReplicaAcked",
    "Role",
    "SourceKind",
    "SourceReady",
    "Span",
    "Subscription",
    "Topic",
    "decode_event",
    "encode_event",
    "make_bus",
]
