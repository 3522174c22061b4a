"""A real crash: a separate process reads a source from Redis, never acks, and is SIGKILLed.

Its message must reach the surviving consumer, and a restarted consumer whose ledger (a Redis SET)
already holds the source id must not apply it again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import redis
from bus_helpers import CLAIM_IDLE_S, REDIS_URL, drain, source

from thundersync.bus.ledger import ExactlyOnce, RedisLedger
from thundersync.bus.protocol import Topic
from thundersync.bus.redis_streams import RedisStreamsBus

ROOT = Path(__file__).resolve().parents[2]

_VICTIM = textwrap.dedent(
    """
    import sys, time
    from thundersync.bus.redis_streams import RedisStreamsBus
    from thundersync.bus.ledger import RedisLedger
    bus = RedisStreamsBus(url=sys.argv[1], prefix=sys.argv[2], claim_idle_s=3600)
    sub = bus.subscribe("learner", "learner", "victim")
    got = []
    while not got:
        got = sub.receive(timeout_s=1.0)
    if sys.argv[3] == "apply":  # applied and recorded, but killed before the ack
        RedisLedger(bus.client, sys.argv[2] + ":applied").add(got[0].event.dedup_key())
    print(got[0].message_id, flush=True)
    time.sleep(600)
    """
)


def _run_victim(prefix: str, mode: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, REDIS_URL, prefix, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        mid = proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert mid, "victim process read nothing"
    return mid


def test_message_read_by_a_killed_process_is_redelivered(redis_prefix: str) -> None:
    bus = RedisStreamsBus(url=REDIS_URL, prefix=redis_prefix, claim_idle_s=CLAIM_IDLE_S)
    bus.publish(source(0))
    mid = _run_victim(redis_prefix, "read")
    sub = bus.subscribe(Topic.LEARNER, "learner", "survivor")
    (d,) = drain(sub, 1)
    assert d.message_id == mid and d.redelivered
    assert bus.client.xpending(bus.key(Topic.LEARNER), "learner")["pending"] == 0


def test_redelivery_of_an_applied_but_unacked_source_is_skipped(redis_prefix: str) -> None:
    bus = RedisStreamsBus(url=REDIS_URL, prefix=redis_prefix, claim_idle_s=CLAIM_IDLE_S)
    bus.publish(source(0))
    bus.publish(source(1))
    _run_victim(redis_prefix, "apply")  # reads both, records s0 as applied, acks neither
    sub = bus.subscribe(Topic.LEARNER, "learner", "survivor")
    once = ExactlyOnce(RedisLedger(redis.Redis.from_url(REDIS_URL), redis_prefix + ":applied"))
    applied: list[str] = []
    for d in drain(sub, 2, ack=False):
        once.apply(sub, d, lambda e: applied.append(e.source_id))  # type: ignore[union-attr]
    assert applied == ["s1"]
    assert once.skipped == 1
    assert sub.pending() == 0
