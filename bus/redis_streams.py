"""Redis Streams bus: the durable broker for multi-process / multi-node runs.

One stream per topic (`{prefix}:{topic}`), consumer groups created at id 0 (a late subscriber still
sees the retained log), XREADGROUP to receive, XACK only after the consumer applied the event.
Crash recovery: a consumer restarted under its old name first re-reads its own pending entries
(XREADGROUP id 0); any other consumer of the group claims entries idle for `claim_idle_s` with
XAUTOCLAIM (checked every claim_idle_s / 2), so an event read by a killed consumer is delivered again.
Deliveries are at-least-once; pair with `bus.ledger.ExactlyOnce` to apply each source once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis
from pydantic import ValidationError

from thundersync.bus.events import Event, decode_event, encode_event
from thundersync.bus.protocol import BusError, Delivery, default_topic

log = logging.getLogger(__name__)
_FIELD = b"e"


class RedisStreamsBus:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "tsrl",
        claim_idle_s: float = 30.0,
        maxlen: int = 100_000,
        client: redis.Redis | None = None,
        expire_s: int | None = None,
    ) -> None:
        self.prefix = prefix
        self.claim_idle_s = claim_idle_s
        self.maxlen = maxlen
        # a run's streams outlive it only by this long, even when its driver is SIGKILLed
        # before it can delete them (every publish pushes the deadline out again)
        self.expire_s = expire_s
        self.client = client or redis.Redis.from_url(url, decode_responses=False)
        try:
            self.client.ping()
        except redis.exceptions.ConnectionError as e:
            raise BusError(
                f"cannot reach Redis at {url}: {e}. Start redis-server or use the inproc bus"
            ) from e

    def key(self, topic: str) -> str:
        return f"{self.prefix}:{topic}"

    def publish(self, event: Event, topic: str | None = None) -> str:
        name = str(topic or default_topic(event))
        key = self.key(name)
        if self.expire_s is None:
            mid = self.client.xadd(
                key, {_FIELD: encode_event(event)}, maxlen=self.maxlen, approximate=True
            )
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(key, {_FIELD: encode_event(event)}, maxlen=self.maxlen, approximate=True)
            pipe.expire(key, self.expire_s)
            mid = pipe.execute()[0]
        return mid.decode() if isinstance(mid, bytes) else str(mid)

    def subscribe(self, topic: str, group: str, consumer: str) -> RedisSubscription:
        try:
            self.client.xgroup_create(self.key(str(topic)), group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        if self.expire_s is not None:
            self.client.expire(self.key(str(topic)), self.expire_s)
        return RedisSubscription(self, str(topic), group, consumer)

    def delete(self, *topics: str) -> None:
        """Remove topic streams (tests and finished runs)."""
        if topics:
            self.client.delete(*(self.key(t) for t in topics))

    def close(self) -> None:
        self.client.close()


class RedisSubscription:
    def __init__(self, bus: RedisStreamsBus, topic: str, group: str, consumer: str) -> None:
        self.bus, self.topic, self.group, self.consumer = bus, topic, group, consumer
        self.key = bus.key(topic)
        self._own_drained = False
        self._last_claim = 0.0
        self._closed = False
        self.rejected: list[str] = []  # ids of undecodable messages (acked, never applied)

    def _deliveries(self, entries: Any, redelivered: bool) -> list[Delivery]:
        out: list[Delivery] = []
        for mid_raw, fields in entries:
            mid = mid_raw.decode() if isinstance(mid_raw, bytes) else str(mid_raw)
            if not fields or _FIELD not in fields:  # entry trimmed or deleted meanwhile
                self.bus.client.xack(self.key, self.group, mid)
                continue
            try:
                ev = decode_event(fields[_FIELD])
            except ValidationError as e:
                log.error("bus %s: dropping undecodable message %s: %s", self.key, mid, e)
                self.rejected.append(mid)
                self.bus.client.xack(self.key, self.group, mid)
                continue
            out.append(Delivery(mid, self.topic, ev, redelivered))
        return out

    def _read(self, ids: str, count: int, block_ms: int | None) -> Any:
        resp = self.bus.client.xreadgroup(
            self.group, self.consumer, {self.key: ids}, count=count, block=block_ms
        )
        if not resp:
            return []
        if isinstance(resp, dict):  # RESP3 shape
            return next(iter(resp.values()))[0] if resp else []
        return resp[0][1]

    def receive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        if self._closed:
            return []
        out: list[Delivery] = []
        if not self._own_drained:
            out += self._deliveries(self._read("0", max_count, None), True)
            self._own_drained = len(out) < max_count
        now = time.monotonic()
        if len(out) < max_count and now - self._last_claim >= self.bus.claim_idle_s / 2:
            self._last_claim = now
            resp = self.bus.client.xautoclaim(
                self.key,
                self.group,
                self.consumer,
                min_idle_time=int(self.bus.claim_idle_s * 1000),
                start_id="0-0",
                count=max_count - len(out),
            )
            out += self._deliveries(resp[1], True)
        if out:
            return out
        # block in slices so idle messages of crashed consumers get claimed while we wait
        deadline = now + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            block = max(1, int(min(left, max(self.bus.claim_idle_s / 2, 0.001)) * 1000))
            out = self._deliveries(self._read(">", max_count, block), False)
            if out:
                return out
            if time.monotonic() - self._last_claim >= self.bus.claim_idle_s / 2:
                return self.receive(max(0.0, deadline - time.monotonic()), max_count)

    async def areceive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        return await asyncio.to_thread(self.receive, timeout_s, max_count)

    def ack(self, *deliveries: Delivery) -> None:
        if deliveries:
            self.bus.client.xack(self.key, self.group, *(d.message_id for d in deliveries))

    def pending(self) -> int:
        info = self.bus.client.xpending_range(
            self.key, self.group, min="-", max="+", count=1_000_000, consumername=self.consumer
        )
        return len(info)

    def close(self) -> None:
        self._closed = True
