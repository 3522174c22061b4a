"""Fixtures for the control-plane tests: a real database per test (SQLite file, and a throwaway
PostgreSQL database on 127.0.0.1:5432), a running app with its launcher, and tokens.

Drivers in these tests are the stand-in `fake_driver.py` (the side not under test) except in
test_acceptance_flow.py, which runs the real `tsrl train`.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from service.settings import Settings

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
FAKE_DRIVER = [sys.executable, str(Path(__file__).with_name("fake_driver.py"))]


def _pg_admin() -> Any:
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.fail(
            f"PostgreSQL is not answering on 127.0.0.1:5432 ({err}): start it with "
            "`bash scripts/setup.d/10-services.sh` (as root)"
        )


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    name = "tsrl_test_" + uuid.uuid4().hex[:12]
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with _pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path / "data")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def admin() -> dict[str, str]:
    return bearer(ADMIN_TOKEN)


@pytest.fixture
def new_token(client: TestClient, admin: dict[str, str]) -> Callable[[str], dict[str, str]]:
    """Make a (non-admin) token through the API and return its auth header."""

    def make(name: str = "user") -> dict[str, str]:
        res = client.post("/api/v1/tokens", json={"name": name}, headers=admin)
        assert res.status_code == 201, res.text
        return bearer(res.json()["token"])

    return make


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


def wait_final(client: TestClient, run_id: str, headers: dict[str, str]) -> dict[str, Any]:
    return wait_for(
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=headers).json(),
        lambda r: r["status"] in ("succeeded", "failed", "cancelled"),
    )
