"""A dead run's Redis bus keys are deleted by the service (real Redis on 127.0.0.1:6379): when a
driver it watches is SIGKILLed, and when a restarted service reconciles a run whose driver died
while it was down. Keys of other runs (another pid under the same name, another run id) stay."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, wait_final, wait_for

from thundersync.service.main import create_app
from thundersync.service.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"
DRIVER = [sys.executable, str(Path(__file__).with_name("redis_driver.py"))]


@pytest.fixture
def redis_client() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as err:
        pytest.fail(f"Redis is not answering on 127.0.0.1:6379 ({err}): start redis-server")
    yield client
    client.close()


def _settings(database_url: str, tmp_path: Path, **kw: Any) -> Settings:
    return make_settings(
        database_url, tmp_path / "data", driver_command=DRIVER, redis_url=REDIS_URL, **kw
    )


def _start_run(c: TestClient, settings: Settings, name: str) -> tuple[str, dict[str, Any]]:
    res = c.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "name": name}, headers=bearer(ADMIN_TOKEN)
    )
    assert res.status_code == 201, res.text
    run_id = res.json()["id"]
    bus_file = settings.runs_dir / run_id / "bus.json"
    wait_for(lambda: bus_file.exists() and bus_file.read_text(), bool, timeout=60)
    return run_id, json.loads(bus_file.read_text())


def _keys(client: Any, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=prefix.replace("*", r"\*") + ":*"))


def _decoys(client: Any, name: str, pid: int) -> list[str]:
    keys = [
        f"tsrl:{name}-{pid + 100000}-{int(time.time())}:learner",  # same name, another driver
        f"tsrl:{uuid.uuid4()}:learner",  # another service run
    ]
    for key in keys:
        client.xadd(key, {"e": "x"})
    return keys


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_sigkilled_driver_leaves_no_keys(
    database_url: str, tmp_path: Path, redis_client: Any
) -> None:
    settings = _settings(database_url, tmp_path)
    name = f"bus-{uuid.uuid4().hex[:6]}"
    with TestClient(create_app(settings)) as c:
        run_id, bus = _start_run(c, settings, name)
        for prefix in bus["prefixes"]:
            assert len(_keys(redis_client, prefix)) == 3, prefix
        assert bus["prefixes"][0] == f"tsrl:{run_id}"
        decoys = _decoys(redis_client, name, bus["pid"])
        try:
            _kill(bus["pid"])
            run = wait_final(c, run_id, bearer(ADMIN_TOKEN))
            assert run["status"] == "failed", run
            for prefix in bus["prefixes"]:
                assert _keys(redis_client, prefix) == [], prefix
            assert all(redis_client.exists(k) for k in decoys)
        finally:
            redis_client.delete(*decoys)


def test_reconciling_service_cleans_a_dead_runs_keys(
    database_url: str, tmp_path: Path, redis_client: Any
) -> None:
    settings = _settings(database_url, tmp_path, stop_runs_on_exit=False)
    name = f"bus-{uuid.uuid4().hex[:6]}"
    with TestClient(create_app(settings)) as c:
        run_id, bus = _start_run(c, settings, name)
    # the service is down; its driver dies without a word
    decoys = _decoys(redis_client, name, bus["pid"])
    try:
        _kill(bus["pid"])
        for prefix in bus["prefixes"]:
            assert len(_keys(redis_client, prefix)) == 3
        with TestClient(create_app(settings)) as c:
            run = c.get(f"/api/v1/runs/{run_id}", headers=bearer(ADMIN_TOKEN)).json()
            assert run["status"] == "failed" and "restarted" in run["reason"], run
        for prefix in bus["prefixes"]:
            assert _keys(redis_client, prefix) == [], prefix
        assert all(redis_client.exists(k) for k in decoys)
    finally:
        redis_client.delete(*decoys)
