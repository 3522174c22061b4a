"""Consumer-group semantics that both backends must share (parametrised over inproc and Redis)."""

from __future__ import annotations

import asyncio
import threading
import time

from bus_helpers import drain, source

from thundersync.bus.ledger import ExactlyOnce
from thundersync.bus.protocol import Bus, Topic


def test_messages_arrive_in_publish_order_per_topic(bus: Bus) -> None:
    for i in range(150):
        bus.publish(source(i))
    sub = bus.subscribe(Topic.LEARNER, "learner", "c0")
    got = drain(sub, 150)
    assert [d.event.source_id for d in got] == [f"s{i}" for i in range(150)]  # type: ignore[union-attr]


def test_acked_message_is_never_delivered_again(bus: Bus) -> None:
    bus.publish(source(0))
    a = bus.subscribe(Topic.LEARNER, "learner", "a")
    (d,) = drain(a, 1, ack=False)
    assert a.pending() == 1
    a.ack(d)
    assert a.pending() == 0
    b = bus.subscribe(Topic.LEARNER, "learner", "b")
    time.sleep(0.3)  # longer than claim_idle_s: an unacked message would be claimable now
    assert b.receive(timeout_s=0.5) == []


def test_unacked_message_of_a_dead_consumer_is_redelivered_to_another(bus: Bus) -> None:
    bus.publish(source(7))
    a = bus.subscribe(Topic.LEARNER, "learner", "a")
    (first,) = drain(a, 1, ack=False)
    a.close()  # "crash": read but never acked
    b = bus.subscribe(Topic.LEARNER, "learner", "b")
    (again,) = drain(b, 1)
    assert again.redelivered
    assert again.message_id == first.message_id
    assert again.event == first.event
    assert b.pending() == 0


def test_restarted_consumer_gets_its_own_pending_messages_first(bus: Bus) -> None:
    bus.publish(source(1))
    a = bus.subscribe(Topic.LEARNER, "learner", "a")
    drain(a, 1, ack=False)
    a.close()
    a2 = bus.subscribe(Topic.LEARNER, "learner", "a")
    (d,) = a2.receive(timeout_s=0.1)
    assert d.redelivered and d.event.source_id == "s1"  # type: ignore[union-attr]


def test_each_group_sees_every_message_and_consumers_of_a_group_split_them(bus: Bus) -> None:
    for i in range(20):
        bus.publish(source(i))
    c1 = bus.subscribe(Topic.LEARNER, "learner", "c1")
    c2 = bus.subscribe(Topic.LEARNER, "learner", "c2")
    other = bus.subscribe(Topic.LEARNER, "metrics", "m")
    part1 = c1.receive(timeout_s=1.0, max_count=10)
    part2 = drain(c2, 10)
    ids1 = {d.message_id for d in part1}
    ids2 = {d.message_id for d in part2}
    assert len(ids1) == 10 and len(ids2) == 10 and not ids1 & ids2
    assert len(drain(other, 20)) == 20


def test_duplicate_publish_is_applied_once(bus: Bus) -> None:
    bus.publish(source(1, source_id="dup"))
    bus.publish(source(2, source_id="dup"))  # a publisher retry: new event id, same source
    bus.publish(source(3, source_id="other"))
    sub = bus.subscribe(Topic.LEARNER, "learner", "c")
    once = ExactlyOnce()
    applied: list[str] = []
    for d in drain(sub, 3, ack=False):
        once.apply(sub, d, lambda e: applied.append(e.source_id))  # type: ignore[union-attr]
    assert applied == ["dup", "other"]
    assert once.skipped == 1
    assert sub.pending() == 0


def test_async_consumer_is_woken_by_a_publish_from_another_thread(bus: Bus) -> None:
    sub = bus.subscribe(Topic.LEARNER, "learner", "async")

    async def consume() -> list[str]:
        got: list[str] = []
        while len(got) < 3:
            for d in await sub.areceive(timeout_s=2.0):
                got.append(d.event.source_id)  # type: ignore[union-attr]
                sub.ack(d)
        return got

    def produce() -> None:
        for i in range(3):
            time.sleep(0.01)
            bus.publish(source(i))

    t = threading.Thread(target=produce)
    t.start()
    got = asyncio.run(asyncio.wait_for(consume(), timeout=20))
    t.join()
    assert got == ["s0", "s1", "s2"]


def test_competing_consumer_threads_apply_every_source_once(bus: Bus) -> None:
    n = 120
    for i in range(n):
        bus.publish(source(i))
        if i % 10 == 0:
            bus.publish(source(i))  # publisher retries: duplicates of the same source id
    once = ExactlyOnce()
    applied: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        sub = bus.subscribe(Topic.LEARNER, "learner", name)
        idle = 0
        while idle < 3:
            got = sub.receive(timeout_s=0.2, max_count=8)
            idle = 0 if got else idle + 1
            for d in got:
                with lock:  # the learner applies one source at a time
                    once.apply(sub, d, lambda e: applied.append(e.source_id))  # type: ignore[union-attr]

    threads = [threading.Thread(target=worker, args=(f"w{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(applied) == sorted(f"s{i}" for i in range(n))
    assert once.skipped == 12
