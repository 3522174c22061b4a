from __future__ import annotations

import pytest

from thundersync.bus.factory import make_bus
from thundersync.bus.inproc import InProcessBus
from thundersync.bus.protocol import Bus, BusError
from thundersync.bus.redis_streams import RedisStreamsBus


def test_make_bus_builds_each_backend_behind_the_protocol() -> None:
    b = make_bus("inproc")
    assert isinstance(b, InProcessBus) and isinstance(b, Bus)
    r = make_bus("redis", prefix="tsrl-test-make")
    assert isinstance(r, RedisStreamsBus) and isinstance(r, Bus)
    r.close()


def test_unreachable_redis_gives_an_actionable_error() -> None:
    with pytest.raises(BusError, match="use the inproc bus"):
        RedisStreamsBus(url="redis://127.0.0.1:1/0")


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError):
        make_bus("kafka")
