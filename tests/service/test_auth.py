"""Auth: bearer tokens, hashed storage, per-token isolation, admin-only token management."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings
from sqlalchemy import create_engine, text

from thundersync.service.main import create_app
from thundersync.service.settings import Settings


def test_healthz_needs_no_token(client: TestClient) -> None:
    res = client.get("/healthz")
    assert res.status_code == 200 and res.json()["status"] == "ok"


def test_missing_and_wrong_tokens_get_401(client: TestClient) -> None:
    for headers in ({}, bearer("not-a-token"), {"Authorization": "Basic abc"}):
        res = client.get("/api/v1/runs", headers=headers)
        assert res.status_code == 401, (headers, res.text)
        assert res.headers["www-authenticate"] == "Bearer"
        assert "token" in res.json()["detail"]


def test_another_tokens_run_is_404_and_not_listed(
    client: TestClient, new_token: Callable[[str], dict[str, str]]
) -> None:
    alice, bob = new_token("alice"), new_token("bob")
    run = client.post("/api/v1/runs", json={"recipe": "grpo-toy"}, headers=alice).json()
    for path in ("", "/updates", "/spans", "/logs", "/speedup", "/time-to-target", "/events"):
        res = client.get(f"/api/v1/runs/{run['id']}{path}", headers=bob)
        assert res.status_code == 404, (path, res.text)
    assert client.post(f"/api/v1/runs/{run['id']}/cancel", headers=bob).status_code == 404
    assert client.delete(f"/api/v1/runs/{run['id']}", headers=bob).status_code == 404
    assert client.get("/api/v1/runs", headers=bob).json()["count"] == 0
    assert client.get("/api/v1/runs", headers=alice).json()["count"] == 1


def test_only_admins_manage_tokens(
    client: TestClient, admin: dict[str, str], new_token: Callable[[str], dict[str, str]]
) -> None:
    user = new_token("user")
    assert client.post("/api/v1/tokens", json={"name": "x"}, headers=user).status_code == 403
    assert client.get("/api/v1/tokens", headers=user).status_code == 403
    assert client.get("/api/v1/tokens/me", headers=user).json()["name"] == "user"
    listed = client.get("/api/v1/tokens", headers=admin).json()
    assert {t["name"] for t in listed["data"]} >= {"admin", "user"}
    assert all("token" not in t for t in listed["data"])


def test_revoked_token_gets_401(client: TestClient, admin: dict[str, str]) -> None:
    made = client.post("/api/v1/tokens", json={"name": "temp"}, headers=admin).json()
    assert client.get("/api/v1/runs", headers=bearer(made["token"])).status_code == 200
    res = client.delete(f"/api/v1/tokens/{made['id']}", headers=admin)
    assert res.status_code == 200 and res.json()["revoked_at"] is not None
    assert client.get("/api/v1/runs", headers=bearer(made["token"])).status_code == 401


def test_tokens_are_stored_hashed_never_in_plaintext(
    client: TestClient, admin: dict[str, str], settings: Settings
) -> None:
    secret = client.post("/api/v1/tokens", json={"name": "h"}, headers=admin).json()["token"]
    engine = create_engine(settings.db_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM tokens")).all()
    engine.dispose()
    dump = repr(rows)
    assert secret not in dump and ADMIN_TOKEN not in dump
    import hashlib

    assert hashlib.sha256(secret.encode()).hexdigest() in dump


def test_restart_with_a_new_admin_token_revokes_the_old_one(
    database_url: str, tmp_path: Path
) -> None:
    first = make_settings(database_url, tmp_path, admin_token="first-admin-secret")
    with TestClient(create_app(first, launch=False)) as c:
        assert c.get("/api/v1/runs", headers=bearer("first-admin-secret")).status_code == 200
        made = c.post("/api/v1/tokens", json={"name": "ci"}, headers=bearer("first-admin-secret"))
        ci = made.json()["token"]
    second = make_settings(database_url, tmp_path, admin_token="second-admin-secret")
    with TestClient(create_app(second, launch=False)) as c:
        assert c.get("/api/v1/runs", headers=bearer("first-admin-secret")).status_code == 401
        assert c.get("/api/v1/runs", headers=bearer("second-admin-secret")).status_code == 200
        assert c.get("/api/v1/runs", headers=bearer(ci)).status_code == 200
