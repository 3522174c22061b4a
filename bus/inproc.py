"""In-process bus: the embedded default (one machine, no broker).

Thread-safe: publishers and consumers may live on different threads (a lock plus a condition
variable), and asyncio consumers wait on an `asyncio.Event` that publishers set through
`loop.call_soon_threadsafe`, so a publish wakes a waiting coroutine on any loop without polling.
Semantics mirror Redis Streams consumer groups (see `bus.protocol`): per-group cursor, pending
entries per consumer, claim of entries idle longer than `claim_idle_s`. The log keeps the last
`maxlen` messages (like XADD MAXLEN).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from thundersync.bus.events import Event
from thundersync.bus.protocol import Delivery, default_topic


@dataclass
class _Pending:
    consumer: str
    delivered_at: float


@dataclass
class _Group:
    cursor: int = 0  # sequence number of the next never-delivered message
    pending: dict[int, _Pending] = field(default_factory=dict)
    last_claim: float = 0.0


@dataclass
class _Log:
    base: int = 0  # sequence number of entries[0]
    entries: deque[Event] = field(default_factory=deque)
    groups: dict[str, _Group] = field(default_factory=dict)

    def get(self, seq: int) -> Event | None:
        i = seq - self.base
        return self.entries[i] if 0 <= i < len(self.entries) else None

    @property
    def end(self) -> int:
        return self.base + len(self.entries)


def _mid(seq: int) -> str:
    return f"{seq}-0"


class InProcessBus:
    def __init__(self, claim_idle_s: float = 30.0, maxlen: int = 100_000) -> None:
        self.claim_idle_s = claim_idle_s
        self.maxlen = maxlen
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._logs: dict[str, _Log] = {}
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._closed = False

    # -- publishing -------------------------------------------------------------------------
    def publish(self, event: Event, topic: str | None = None) -> str:
        name = str(topic or default_topic(event))
        with self._cond:
            if self._closed:
                raise RuntimeError("publish on a closed InProcessBus: create a new bus")
            log = self._logs.setdefault(name, _Log())
            log.entries.append(event)
            seq = log.end - 1
            while len(log.entries) > self.maxlen:
                log.entries.popleft()
                log.base += 1
            self._cond.notify_all()
            waiters = list(self._async_waiters)
        for loop, ev in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(ev.set)
        return _mid(seq)

    def subscribe(self, topic: str, group: str, consumer: str) -> InProcessSubscription:
        with self._lock:
            self._logs.setdefault(str(topic), _Log()).groups.setdefault(group, _Group())
        return InProcessSubscription(self, str(topic), group, consumer)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- used by subscriptions (caller holds no lock) ------------------------------------------
    def _take(self, sub: InProcessSubscription, max_count: int) -> list[Delivery]:
        with self._lock:
            return self._take_locked(sub, max_count)

    def _take_locked(self, sub: InProcessSubscription, max_count: int) -> list[Delivery]:
        log = self._logs[sub.topic]
        grp = log.groups[sub.group]
        now = time.monotonic()
        out: list[Delivery] = []

        def deliver(seq: int, redelivered: bool) -> None:
            ev = log.get(seq)
            if ev is None:  # trimmed away: nothing left to deliver
                grp.pending.pop(seq, None)
                return
            grp.pending[seq] = _Pending(sub.consumer, now)
            out.append(Delivery(_mid(seq), sub.topic, ev, redelivered))

        if not sub._own_drained:  # a restarted consumer first gets its own pending messages
            for seq in sorted(s for s, p in grp.pending.items() if p.consumer == sub.consumer):
                if len(out) >= max_count:
                    break
                deliver(seq, True)
            sub._own_drained = len(out) < max_count
        if now - grp.last_claim >= self.claim_idle_s / 2:
            grp.last_claim = now
            stale = sorted(
                s for s, p in grp.pending.items() if now - p.delivered_at >= self.claim_idle_s
            )
            for seq in stale:
                if len(out) >= max_count:
                    break
                deliver(seq, True)
        grp.cursor = max(grp.cursor, log.base)
        while len(out) < max_count and grp.cursor < log.end:
            deliver(grp.cursor, False)
            grp.cursor += 1
        return out

    def _ack(self, sub: InProcessSubscription, ids: list[str]) -> None:
        with self._lock:
            grp = self._logs[sub.topic].groups[sub.group]
            for mid in ids:
                grp.pending.pop(int(mid.split("-", 1)[0]), None)

    def _pending_of(self, sub: InProcessSubscription) -> int:
        with self._lock:
            grp = self._logs[sub.topic].groups[sub.group]
            return sum(1 for p in grp.pending.values() if p.consumer == sub.consumer)


class InProcessSubscription:
    def __init__(self, bus: InProcessBus, topic: str, group: str, consumer: str) -> None:
        self.bus, self.topic, self.group, self.consumer = bus, topic, group, consumer
        self._own_drained = False
        self._closed = False

    def receive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        with self.bus._cond:
            while True:
                if self._closed or self.bus._closed:
                    return []
                out = self.bus._take_locked(self, max_count)
                left = deadline - time.monotonic()
                if out or left <= 0:
                    return out
                # wake up for publishes, and in time to claim idle messages of crashed consumers
                self.bus._cond.wait(min(left, max(self.bus.claim_idle_s / 2, 1e-3)))

    async def areceive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        ev = asyncio.Event()
        waiter = (loop, ev)
        while True:
            if self._closed or self.bus._closed:
                return []
            with self.bus._lock:
                out = self.bus._take_locked(self, max_count)
                if not out:
                    ev.clear()
                    self.bus._async_waiters.add(waiter)
            left = deadline - loop.time()
            if out or left <= 0:
                with self.bus._lock:
                    self.bus._async_waiters.discard(waiter)
                return out
            try:
                await asyncio.wait_for(ev.wait(), min(left, max(self.bus.claim_idle_s / 2, 1e-3)))
            except TimeoutError:
                pass
            finally:
                with self.bus._lock:
                    self.bus._async_waiters.discard(waiter)

    def ack(self, *deliveries: Delivery) -> None:
        self.bus._ack(self, [d.message_id for d in deliveries])

    def pending(self) -> int:
        return self.bus._pending_of(self)

    def close(self) -> None:
        self._closed = True
