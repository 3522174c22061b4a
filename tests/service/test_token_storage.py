"""No part of any secret is stored: the tokens table holds a SHA-256 digest and a random public id
(`tok_` + 8 characters), never a prefix of the secret, on SQLite and PostgreSQL. Tokens are shown
and looked up by that public id."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import bearer
from sqlalchemy import create_engine, text

from thundersync.service.main import create_app
from thundersync.service.settings import Settings

PUBLIC_ID = re.compile(r"^tok_[A-Za-z0-9_-]{8}$")
# Every 4-character window of these secrets holds a '~' or '!', which no stored value can hold by
# chance (digests and ids are hex, public ids url-safe base64, names and times are chosen here),
# so any window found in a row is a stored piece of the secret, not a coincidence.
SHORT_ADMIN = "Q~x!k7"  # shorter than the 9 characters the old `prefix` column kept
LONG_ADMIN = "adm~n!se~cr!et~or!ok~ay!"


def _scripted_secrets() -> Iterator[str]:
    for k in itertools.count():
        yield "tsrl_" + "".join(f"~{c}{k % 10}!" for c in "abcdefghij")


def _windows(secret: str, size: int) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def _token_rows(settings: Settings) -> list[str]:
    engine = create_engine(settings.db_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM tokens")).all()
    engine.dispose()
    return [" | ".join(str(v) for v in row) for row in rows]


def _leaks(rows: list[str], secrets: dict[str, int]) -> list[tuple[str, str]]:
    return [
        (piece, row)
        for secret, size in secrets.items()
        for piece in _windows(secret, size)
        for row in rows
        if piece in row
    ]


def test_no_part_of_any_secret_is_stored(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = _scripted_secrets()
    secrets: dict[str, int] = {SHORT_ADMIN: 4, LONG_ADMIN: 4}
    with TestClient(create_app(replace(settings, admin_token=LONG_ADMIN), launch=False)) as c:
        made = c.post("/api/v1/tokens", json={"name": "real"}, headers=bearer(LONG_ADMIN))
        assert made.status_code == 201, made.text
        # a real secret: random, so only windows of 8+ characters are safe from coincidences
        secrets[made.json()["token"]] = 8
        monkeypatch.setattr("thundersync.service.crud_tokens.new_token", lambda: next(scripted))
        for name, is_admin in (("alice", False), ("bob", False), ("ops", True)):
            res = c.post(
                "/api/v1/tokens",
                json={"name": name, "is_admin": is_admin},
                headers=bearer(LONG_ADMIN),
            )
            assert res.status_code == 201, res.text
            secret = res.json()["token"]
            assert "~" in secret and c.get("/api/v1/tokens/me", headers=bearer(secret)).is_success
            secrets[secret] = 4
    # restart with a short admin token: the old admin row stays (revoked), a new one is added
    with TestClient(create_app(replace(settings, admin_token=SHORT_ADMIN), launch=False)) as c:
        assert c.get("/api/v1/runs", headers=bearer(SHORT_ADMIN)).status_code == 200
        listed = c.get("/api/v1/tokens", headers=bearer(SHORT_ADMIN)).json()
    assert listed["count"] == 6
    rows = _token_rows(settings)
    assert len(rows) == 6
    assert _leaks(rows, secrets) == []
    for token in listed["data"]:
        assert PUBLIC_ID.match(token["public_id"]), token
        assert "prefix" not in token
    assert len({t["public_id"] for t in listed["data"]}) == 6


def test_public_ids_show_and_find_tokens(client: TestClient, admin: dict[str, str]) -> None:
    made = client.post("/api/v1/tokens", json={"name": "ci"}, headers=admin).json()
    public_id = made["public_id"]
    assert PUBLIC_ID.match(public_id) and public_id[4:] not in made["token"]
    me = client.get("/api/v1/tokens/me", headers=bearer(made["token"])).json()
    assert me["public_id"] == public_id and "prefix" not in me
    for ref in (public_id, made["id"]):
        res = client.get(f"/api/v1/tokens/{ref}", headers=admin)
        assert res.status_code == 200 and res.json()["id"] == made["id"], res.text
    assert (
        client.get(f"/api/v1/tokens/{public_id}", headers=bearer(made["token"])).status_code == 403
    )
    assert client.get("/api/v1/tokens/tok_00000000", headers=admin).status_code == 404
    assert client.get("/api/v1/tokens/tok_short", headers=admin).status_code == 422
    assert client.delete("/api/v1/tokens/not-an-id", headers=admin).status_code == 422
    res = client.delete(f"/api/v1/tokens/{public_id}", headers=admin)
    assert res.status_code == 200 and res.json()["revoked_at"] is not None
    assert client.get("/api/v1/runs", headers=bearer(made["token"])).status_code == 401
