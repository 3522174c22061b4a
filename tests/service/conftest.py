"""Fixtures for the control-plane tests: a real database per test (SQLite file, and a throwaway
PostgreSQL database on 127.0.0.1:5432), a running app with its launcher, and tokens.

Drivers in these tests are the stand-in `fake_driver.py` (the side not under test) except in
test_acceptance_flow.py, which runs the real `tsrl train`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, pg_admin

from thundersync.service.main import create_app
from thundersync.service.settings import Settings


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    name = "tsrl_test_" + uuid.uuid4().hex[:12]
    with pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path / "data")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


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
