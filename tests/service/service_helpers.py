"""Helpers shared by the control-plane tests (imported by name; fixtures live in conftest.py)."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from thundersync.service.settings import Settings

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
FAKE_DRIVER = [sys.executable, str(Path(__file__).with_name("fake_driver.py"))]


def pg_admin() -> Any:
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.fail(
            f"PostgreSQL is not answering on 127.0.0.1:5432 ({err}): start it with "
            "`bash scripts/setup.d/10-services.sh` (as root)"
        )


def make_settings(database_url: str, data_dir: Path, **kw: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "admin_token": ADMIN_TOKEN,
        "driver_command": FAKE_DRIVER,
        "poll_interval_s": 0.05,
        "max_concurrent_runs": 2,
    }
    values.update(kw)
    return Settings(**values)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_for(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 60.0) -> Any:
    """Poll `fetch` until `done(value)`; the timeout only bounds a hang (no timing assertion)."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not done(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s; last value: {value}")
        time.sleep(0.05)
        value = fetch()
    return value


def wait_final(client: Any, run_id: str, headers: dict[str, str]) -> dict[str, Any]:
    return wait_for(
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=headers).json(),
        lambda r: r["status"] in ("succeeded", "failed", "cancelled"),
    )


def wait_succeeded(api: Any, run_id: str, timeout_s: float = 600) -> dict[str, Any]:
    """Wait for the run to end (`api`: an httpx.Client with a token); assert it succeeded, with
    its output log's tail as the message."""
    run = wait_for(
        lambda: api.get(f"/api/v1/runs/{run_id}").json(),
        lambda r: r["status"] in ("succeeded", "failed", "cancelled"),
        timeout_s,
    )
    logs = api.get(f"/api/v1/runs/{run_id}/logs?source=output").json()["text"]
    assert run["status"] == "succeeded", (run, logs[-3000:])
    return dict(run)
