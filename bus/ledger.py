"""Exactly-once application on top of at-least-once delivery.

Redelivery (a consumer crash, a publisher retry) may hand the same source to the learner twice; a
gradient applied twice is a silently wrong update. The consumer therefore records the dedup key of
every applied event (`Event.dedup_key()`, the source id for sources) in a ledger and skips keys it
has seen. Order per delivery: check ledger -> apply -> record -> ack. A crash between apply and ack
leaves the message pending; its redelivery is then skipped by the ledger.

`MemoryLedger` lives with the consumer's in-memory state (the learner's accumulators): both die
together, so a restarted learner resumes from its checkpoint with a fresh ledger. `RedisLedger`
keeps the keys in a Redis SET, for consumers whose applied effects are durable (a database writer,
a driver restarted mid-update): a restarted consumer skips ids already applied. Scope its key to
what the effects are scoped to (e.g. `tsrl:{run}:applied:{update}`) and give it a TTL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import redis

from thundersync.bus.events import Event
from thundersync.bus.protocol import Delivery, Subscription


class AppliedLedger(Protocol):
    def contains(self, key: str) -> bool: ...

    def add(self, key: str) -> bool:
        """Record key; True if it was not there before."""
        ...

    def __len__(self) -> int: ...


class MemoryLedger:
    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: str) -> bool:
        with self._lock:
            new = key not in self._keys
            self._keys.add(key)
            return new

    def __len__(self) -> int:
        return len(self._keys)


class RedisLedger:
    def __init__(self, client: redis.Redis, key: str, ttl_s: int | None = 7 * 24 * 3600) -> None:
        self.client, self.key, self.ttl_s = client, key, ttl_s

    def contains(self, key: str) -> bool:
        return bool(self.client.sismember(self.key, key))

    def add(self, key: str) -> bool:
        pipe = self.client.pipeline()
        pipe.sadd(self.key, key)
        if self.ttl_s:
            pipe.expire(self.key, self.ttl_s)
        added = pipe.execute()[0]
        return bool(added)

    def __len__(self) -> int:
        return int(self.client.scard(self.key))  # type: ignore[arg-type]

    def clear(self) -> None:
        self.client.delete(self.key)


class ExactlyOnce:
    """Apply each event's effect once, whatever the number of deliveries."""

    def __init__(self, ledger: AppliedLedger | None = None) -> None:
        self.ledger: AppliedLedger = ledger if ledger is not None else MemoryLedger()
        self.applied = 0
        self.skipped = 0

    def apply(self, sub: Subscription, delivery: Delivery, fn: Callable[[Event], object]) -> bool:
        """Run fn(event) unless already applied, then ack. Returns True if fn ran.

        If fn raises, nothing is recorded or acked: the message stays pending for a retry."""
        key = delivery.event.dedup_key()
        if self.ledger.contains(key):
            self.skipped += 1
            sub.ack(delivery)
            return False
        fn(delivery.event)
        self.ledger.add(key)
        self.applied += 1
        sub.ack(delivery)
        return True
