"""Property-based API checks with schemathesis on the app's own OpenAPI spec: no request the spec
allows (or nearly allows) makes the server answer 5xx, on SQLite and on PostgreSQL (which rejects
NUL bytes and int64 overflow that SQLite accepts). Kept bounded: a few examples per operation.

The stateful test chains calls along the links schemathesis infers from the spec (the id of a
created run, task set, model or token feeds the calls on it): a resource answers while it exists, and is
gone after DELETE (tokens are revoked, not deleted: they stay readable)."""

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
from schemathesis.specs.openapi.checks import (
    ensure_resource_availability,
    response_schema_conformance,
    use_after_free,
)
from service_helpers import ADMIN_TOKEN, make_settings, pg_admin
from sqlalchemy import text

from thundersync.service.main import create_app


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


# Links the stateful test must find (source operation -> target operation), one per resource.
EXPECTED_LINKS = {
    ("POST /api/v1/runs", "GET /api/v1/runs/{run_id}"),
    ("POST /api/v1/runs", "POST /api/v1/runs/{run_id}/cancel"),
    ("POST /api/v1/runs", "DELETE /api/v1/runs/{run_id}"),
    ("POST /api/v1/task-sets", "PATCH /api/v1/task-sets/{task_set_id}"),
    ("POST /api/v1/task-sets", "DELETE /api/v1/task-sets/{task_set_id}"),
    ("POST /api/v1/task-sets", "PUT /api/v1/task-sets/{task_set_id}/files/{file_path}"),
    ("POST /api/v1/models", "GET /api/v1/models/{model_id}"),
    ("POST /api/v1/models", "PUT /api/v1/models/{model_id}/files/{file_path}"),
    ("POST /api/v1/models", "DELETE /api/v1/models/{model_id}"),
    ("POST /api/v1/tokens", "GET /api/v1/tokens/{token_id}"),
    ("POST /api/v1/tokens", "DELETE /api/v1/tokens/{token_id}"),
}


def test_stateful_workflows_have_no_server_errors(api_schema: Any) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    # the SSE stream of a run that never finishes (no launcher here) would not return
    base = api_schema.exclude(path_regex=r"/events$").as_state_machine()
    links = {
        (source, link.target.label)
        for source, transitions in base._transitions.operations.items()
        for link in transitions.outgoing
    }
    assert links >= EXPECTED_LINKS, sorted(EXPECTED_LINKS - links)
    steps: list[tuple[str, int]] = []

    engine = api_schema.app.state.engine

    class Workflow(base):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # every scenario starts from the same database (only the admin token), so a name
            # taken by an earlier scenario cannot turn a 201 into a 409 and change what follows
            with engine.begin() as conn:
                for name in ("updates", "spans", "runs", "task_sets", "models"):
                    conn.execute(text(f"DELETE FROM {name}"))
                conn.execute(text("DELETE FROM tokens WHERE name <> 'admin'"))

        def before_call(self, case: Any) -> None:
            case.headers = {**(case.headers or {}), **auth}  # chains need a valid token
            if case.operation.label == "POST /api/v1/runs" and isinstance(case.body, dict):
                # the spec cannot say which recipe names exist: name one, so that runs get made
                case.body["recipe"] = "grpo-toy"

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            checks = [not_a_server_error, response_schema_conformance, ensure_resource_availability]
            if not case.operation.path.startswith("/api/v1/tokens"):
                checks.append(use_after_free)  # DELETE /tokens/{id} revokes; the token stays
            case.validate_response(
                response, checks=checks, transport_kwargs=kwargs or None, recorder=self.recorder
            )
            steps.append((case.operation.label, response.status_code))

    Workflow.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # scenarios went past their first call: what a call created was then used by a linked one
    ok = {label for label, status in steps if status < 400}
    made = {
        "POST /api/v1/runs",
        "POST /api/v1/task-sets",
        "POST /api/v1/models",
        "POST /api/v1/tokens",
    }
    assert made <= ok, steps
    assert {label for label in ok if "{" in label}, steps
