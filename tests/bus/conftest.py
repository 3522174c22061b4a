"""Bus fixtures: every backend under the same tests; Redis keys get a unique prefix, removed after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from bus_helpers import CLAIM_IDLE_S, REDIS_URL

from thundersync.bus.inproc import InProcessBus
from thundersync.bus.protocol import Bus
from thundersync.bus.redis_streams import RedisStreamsBus


def _cleanup(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"tsrl-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    _cleanup(redis.Redis.from_url(REDIS_URL), prefix)


@pytest.fixture(params=["inproc", "redis"])
def bus(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[Bus]:
    b: Bus
    if request.param == "inproc":
        b = InProcessBus(claim_idle_s=CLAIM_IDLE_S)
    else:
        b = RedisStreamsBus(url=REDIS_URL, prefix=redis_prefix, claim_idle_s=CLAIM_IDLE_S)
    yield b
    b.close()
