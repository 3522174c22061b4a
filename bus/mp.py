"""A bus between the processes of one embedded run (driver <-> learner), on multiprocessing queues.

The in-process bus cannot cross the process boundary that lets the learner overlap with rollout
(its own interpreter, its own core), and the embedded default must not need a broker. The routes
(topic -> consumer groups) are fixed when the bus is built, before the learner process is
spawned; each group gets every event of its topic, in publish order. There is no redelivery: a
queue dies with the run, and a crashed learner resumes from its checkpoint, not from the queue
(use the Redis Streams backend when the learner must survive on its own).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import queue
from typing import Any

from thundersync.bus.events import Event, decode_event, encode_event
from thundersync.bus.protocol import BusError, Delivery, default_topic


def learner_routes(ranks: int) -> dict[str, tuple[str, ...]]:
    names = tuple(f"learner-r{r}" for r in range(ranks))
    return {"learner": names, "control": ("driver", names[0]), "spans": ("driver",)}


class ProcessBus:
    def __init__(self, routes: dict[str, tuple[str, ...]] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.routes = dict(routes or learner_routes(1))
        self._queues: dict[tuple[str, str], Any] = {
            (topic, group): ctx.Queue() for topic, groups in self.routes.items() for group in groups
        }
        self._ids = itertools.count()

    def publish(self, event: Event, topic: str | None = None) -> str:
        t = str(topic or default_topic(event))
        if t not in self.routes:
            raise BusError(f"topic {t!r} has no route: add it to ProcessBus(routes=...)")
        msg_id = f"{t}-{next(self._ids)}"
        line = encode_event(event)
        for group in self.routes[t]:
            self._queues[(t, group)].put((msg_id, line))
        return msg_id

    def subscribe(self, topic: str, group: str, consumer: str) -> ProcessSubscription:
        q = self._queues.get((topic, group))
        if q is None:
            raise BusError(
                f"no route for topic {topic!r} group {group!r}: known {list(self._queues)}"
            )
        return ProcessSubscription(topic, group, consumer, q)

    def close(self) -> None:
        for q in self._queues.values():
            q.close()


class ProcessSubscription:
    def __init__(self, topic: str, group: str, consumer: str, q: Any) -> None:
        self.topic, self.group, self.consumer = topic, group, consumer
        self._q = q

    def receive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        out: list[Delivery] = []
        try:
            msg_id, line = self._q.get(timeout=max(timeout_s, 1e-4))
        except queue.Empty:
            return out
        out.append(Delivery(msg_id, self.topic, decode_event(line)))
        while len(out) < max_count:
            try:
                msg_id, line = self._q.get_nowait()
            except queue.Empty:
                break
            out.append(Delivery(msg_id, self.topic, decode_event(line)))
        return out

    async def areceive(self, timeout_s: float = 1.0, max_count: int = 64) -> list[Delivery]:
        return await asyncio.to_thread(self.receive, timeout_s, max_count)

    def ack(self, *deliveries: Delivery) -> None:
        """Delivery is at-most-once per process lifetime here; nothing to acknowledge."""

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass
