"""A quota per token of concurrent (queued / starting / running) runs: past it POST /runs is a
429 that says why and what to do; a token's own `max_active_runs` wins over the service default;
concurrent submissions never overshoot it (both databases)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings

from thundersync.service.main import create_app

RUN = {"recipe": "grpo-toy"}


@pytest.fixture
def idle_client(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """No launcher: submitted runs stay queued, so they count against the quota."""
    settings = make_settings(database_url, tmp_path / "data", max_active_runs_per_token=2)
    with TestClient(create_app(settings, launch=False)) as c:
        yield c


def _token(c: TestClient, name: str, **extra: object) -> dict[str, str]:
    res = c.post("/api/v1/tokens", json={"name": name, **extra}, headers=bearer(ADMIN_TOKEN))
    assert res.status_code == 201, res.text
    return bearer(res.json()["token"])


def test_quota_429_per_token_and_override(idle_client: TestClient) -> None:
    c = idle_client
    h, other = _token(c, "u"), _token(c, "o")
    ids = [c.post("/api/v1/runs", json=RUN, headers=h).json()["id"] for _ in range(2)]
    res = c.post("/api/v1/runs", json=RUN, headers=h)
    assert res.status_code == 429, res.text
    detail = res.json()["detail"]
    assert detail.startswith("quota: this token has 2 runs queued or running and may have 2")
    assert "cancel" in detail and res.headers["retry-after"]
    assert c.post("/api/v1/runs", json=RUN, headers=other).status_code == 201  # per token
    assert c.post(f"/api/v1/runs/{ids[0]}/cancel", headers=h).status_code == 200
    assert c.post("/api/v1/runs", json=RUN, headers=h).status_code == 201  # a slot came back
    big = _token(c, "big", max_active_runs=4)
    me = c.get("/api/v1/tokens/me", headers=big).json()
    assert me["max_active_runs"] == 4
    codes = [c.post("/api/v1/runs", json=RUN, headers=big).status_code for _ in range(5)]
    assert codes == [201, 201, 201, 201, 429]
    unlimited = _token(c, "free", max_active_runs=0)
    assert all(
        c.post("/api/v1/runs", json=RUN, headers=unlimited).status_code == 201 for _ in range(3)
    )


def test_concurrent_submissions_never_overshoot(idle_client: TestClient) -> None:
    c = idle_client
    h = _token(c, "racer", max_active_runs=3)
    codes: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def submit() -> None:
        start.wait()
        code = c.post("/api/v1/runs", json=RUN, headers=h).status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(codes) == [201] * 3 + [429] * 5, codes
    assert c.get("/api/v1/runs", headers=h).json()["count"] == 3
