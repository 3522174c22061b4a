"""The event bus: typed events (`bus.events`), the Bus / Subscription seam (`bus.protocol`), an
in-process backend (`bus.inproc`, the embedded default) and Redis Streams (`bus.redis_streams`),
a multiprocessing backend for the embedded run (`bus.mp`), plus apply-exactly-once on top of
at-least-once delivery (`bus.ledger`); `bus.factory` builds any of them."""

from thundersync.bus.events import (
    BarrierStats,
    BatchClosed,
    Event,
    GroupClosed,
    GroupRegistered,
    GrpoRewardReady,
    GrpoTrajectoryReady,
    LearnerReady,
    OpdTurnReady,
    PolicyPublished,
    ReplicaAcked,
    Role,
    SourceReady,
    Span,
    TrajectoryRegistered,
    decode_event,
    encode_event,
)
from thundersync.bus.factory import BusKind, make_bus
from thundersync.bus.protocol import Bus, BusError, Delivery, Subscription, Topic

__all__ = [
    "BarrierStats",
    "BatchClosed",
    "Bus",
    "BusError",
    "BusKind",
    "Delivery",
    "Event",
    "GroupClosed",
    "GroupRegistered",
    "GrpoRewardReady",
    "GrpoTrajectoryReady",
    "LearnerReady",
    "OpdTurnReady",
    "PolicyPublished",
    "ReplicaAcked",
    "Role",
    "SourceReady",
    "Span",
    "Subscription",
    "Topic",
    "TrajectoryRegistered",
    "decode_event",
    "encode_event",
    "make_bus",
]
