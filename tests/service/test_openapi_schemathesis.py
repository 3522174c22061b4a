"""Property-based API checks with schemathesis on the app's own OpenAPI spec: no request the spec
allows (or nearly allows) makes the server answer 5xx, on SQLite and on PostgreSQL (which rejects
NUL bytes and int64 overflow that SQLite accepts). Kept bounded: a few examples per operation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from service_helpers import ADMIN_TOKEN, make_settings, pg_admin

from service.main import create_app


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api_schema(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    name = "tsrl_test_st_" + uuid.uuid4().hex[:10]
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'db.sqlite'}"
    else:
        with pg_admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    app = create_app(make_settings(url, Path(tmp)), launch=False)
    with TestClient(app):  # runs the lifespan: migrations and the admin token
        yield schemathesis.openapi.from_asgi("/openapi.json", app)
    app.state.engine.dispose()
    if request.param == "postgresql":
        with pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_no_server_errors(api_schema: Any) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            response = case.call_and_validate(
                headers=auth, checks=[not_a_server_error, response_schema_conformance]
            )
            statuses.append(response.status_code)

        check()
    # the run exercised every operation, with accepted and rejected inputs
    assert len(statuses) >= 3 * len(operations)
    assert {200, 201} <= set(statuses) and 422 in statuses
