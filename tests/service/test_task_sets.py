"""Task sets: register SWE-smith / SETA collections per token; local sources are counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

Headers = Callable[[str], dict[str, str]]


def test_task_set_lifecycle_and_isolation(
    client: TestClient, new_token: Headers, tmp_path: Path
) -> None:
    h, other = new_token("u"), new_token("o")
    jsonl = tmp_path / "swe.jsonl"
    jsonl.write_text("\n".join(json.dumps({"instance_id": f"i{k}"}) for k in range(3)) + "\n")
    seta = tmp_path / "seta"
    for name in ("t1", "t2"):
        (seta / name).mkdir(parents=True)
    res = client.post(
        "/api/v1/task-sets",
        json={"name": "swe-mini", "kind": "swe-smith", "source": str(jsonl)},
        headers=h,
    )
    assert res.status_code == 201, res.text
    swe = res.json()
    assert swe["task_count"] == 3
    seta_set = client.post(
        "/api/v1/task-sets", json={"name": "seta", "kind": "seta", "source": str(seta)}, headers=h
    ).json()
    assert seta_set["task_count"] == 2
    dup = client.post(
        "/api/v1/task-sets", json={"name": "seta", "kind": "seta", "source": "x"}, headers=h
    )
    assert dup.status_code == 409
    assert client.get("/api/v1/task-sets?kind=seta", headers=h).json()["count"] == 1
    assert client.get("/api/v1/task-sets", headers=other).json()["count"] == 0
    assert client.get(f"/api/v1/task-sets/{swe['id']}", headers=other).status_code == 404
    patched = client.patch(
        f"/api/v1/task-sets/{swe['id']}", json={"description": "three bugs"}, headers=h
    ).json()
    assert patched["description"] == "three bugs" and patched["source"] == str(jsonl)
    assert client.delete(f"/api/v1/task-sets/{swe['id']}", headers=h).status_code == 200
    assert client.get(f"/api/v1/task-sets/{swe['id']}", headers=h).status_code == 404


def test_task_set_kind_and_name_are_validated(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    bad_kind = client.post(
        "/api/v1/task-sets", json={"name": "x", "kind": "nope", "source": "s"}, headers=h
    )
    assert bad_kind.status_code == 422 and bad_kind.json()["detail"][0]["loc"] == ["body", "kind"]
    bad_name = client.post(
        "/api/v1/task-sets", json={"name": "a b/c", "kind": "seta", "source": "s"}, headers=h
    )
    assert bad_name.status_code == 422
