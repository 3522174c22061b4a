"""Bad input: invalid configs get 422 naming the field and the fix; oversized bodies get 413;
malformed ids and parameters get 422, never 500."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import make_settings

from thundersync.service.main import create_app

Headers = Callable[[str], dict[str, str]]


@pytest.mark.parametrize(
    ("body", "field", "fix"),
    [
        ({"recipe": "grpo-toy", "overrides": {"updates": 0}}, "updates", "greater than or equal"),
        ({"recipe": "grpo-toy", "overrides": {"optim.lr": -1}}, "optim.lr", "greater than"),
        ({"recipe": "grpo-toy", "overrides": {"optim.lrr": 1}}, "optim.lrr", "remove it"),
        ({"recipe": "grpo-toy", "overrides": {"model.dtype": "int8"}}, "model.dtype", "use one of"),
        ({"recipe": "no-such-recipe"}, "recipe", "use one of"),
        ({"overrides": {"updates": 2}}, "recipe", "give a recipe name"),
        (
            {"config": {"learner": {"estimator": "rloo"}, "rollout": {"group_size": 1}}},
            "<config>",
            "raise group_size",
        ),
    ],
)
def test_invalid_config_is_422_naming_field_and_fix(
    client: TestClient, new_token: Headers, body: dict, field: str, fix: str
) -> None:
    res = client.post("/api/v1/runs", json=body, headers=new_token("u"))
    assert res.status_code == 422, res.text
    msg = res.json()["detail"][0]["msg"]
    assert field in msg and fix in msg, msg
    assert client.get("/api/v1/runs", headers=new_token("v")).json()["count"] == 0


def test_unknown_request_field_and_recipe_paths_are_422(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    res = client.post("/api/v1/runs", json={"recipe": "grpo-toy", "bogus": 1}, headers=h)
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "bogus"]
    res = client.post("/api/v1/runs", json={"recipe": "../../etc/passwd.yaml"}, headers=h)
    assert res.status_code == 422


def test_oversized_body_is_413(tmp_path: Path, new_token: Headers) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path, max_body_bytes=2048)
    with TestClient(create_app(settings, launch=False)) as c:
        from service_helpers import ADMIN_TOKEN, bearer

        big = {"recipe": "grpo-toy", "name": "x" * 100, "overrides": {"x": "y" * 5000}}
        res = c.post("/api/v1/runs", json=big, headers=bearer(ADMIN_TOKEN))
        assert res.status_code == 413, res.text
        assert "limit is 2048 bytes" in res.json()["detail"]

        def chunks():
            yield b'{"recipe": "grpo-toy", "name": "'
            for _ in range(10):
                yield b"x" * 500
            yield b'"}'

        res = c.post(
            "/api/v1/runs",
            content=chunks(),
            headers={**bearer(ADMIN_TOKEN), "Content-Type": "application/json"},
        )
        assert res.status_code == 413


def test_malformed_ids_and_params_are_422(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    assert client.get("/api/v1/runs/not-a-uuid", headers=h).status_code == 422
    assert client.get("/api/v1/runs?limit=0", headers=h).status_code == 422
    assert client.get("/api/v1/runs?skip=99999999999999999999", headers=h).status_code == 422
    assert client.get("/api/v1/runs?status=bogus", headers=h).status_code == 422
    assert client.get("/api/v1/runs?name=a%00b", headers=h).status_code == 422


def test_nul_characters_are_422_on_every_database(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    res = client.post(
        "/api/v1/task-sets", json={"name": "a", "kind": "seta", "source": "x\x00y"}, headers=h
    )
    assert res.status_code == 422 and "source: contains a NUL" in res.text
    res = client.post(
        "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"name": "\x00"}}, headers=h
    )
    assert res.status_code == 422 and "overrides.name" in res.text
