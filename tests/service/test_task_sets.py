"""Task sets: an admin registers host paths (counted), a user uploads tasks into the service's
data dir (counted), a URI is recorded; each token sees its own sets and the shared ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

Headers = Callable[[str], dict[str, str]]
SETS = "/api/v1/task-sets"


def test_admin_host_task_sets_are_counted_and_isolated(
    client: TestClient, admin: dict[str, str], new_token: Headers, tmp_path: Path
) -> None:
    other = new_token("o")
    jsonl = tmp_path / "swe.jsonl"
    jsonl.write_text("\n".join(json.dumps({"instance_id": f"i{k}"}) for k in range(3)) + "\n")
    seta = tmp_path / "seta"
    for name in ("t1", "t2"):
        (seta / name).mkdir(parents=True)
    body = {"name": "swe-mini", "kind": "swe-smith", "source": str(jsonl)}
    res = client.post(SETS, json=body, headers=admin)
    assert res.status_code == 201, res.text
    swe = res.json()
    assert swe["task_count"] == 3 and swe["origin"] == "host" and not swe["shared"]
    seta_set = client.post(
        SETS, json={"name": "seta", "kind": "seta", "source": str(seta)}, headers=admin
    ).json()
    assert seta_set["task_count"] == 2
    dup = client.post(SETS, json={"name": "seta", "kind": "seta", "source": "x"}, headers=admin)
    assert dup.status_code == 409
    assert client.get(f"{SETS}?kind=seta", headers=admin).json()["count"] == 1
    assert client.get(SETS, headers=other).json()["count"] == 0
    assert client.get(f"{SETS}/{swe['id']}", headers=other).status_code == 404
    patched = client.patch(
        f"{SETS}/{swe['id']}", json={"description": "three bugs"}, headers=admin
    ).json()
    assert patched["description"] == "three bugs" and patched["source"] == str(jsonl)
    assert client.delete(f"{SETS}/{swe['id']}", headers=admin).status_code == 200
    assert client.get(f"{SETS}/{swe['id']}", headers=admin).status_code == 404


def test_user_uploads_tasks_and_cannot_register_host_paths(
    client: TestClient, new_token: Headers, tmp_path: Path
) -> None:
    h, other = new_token("u"), new_token("o")
    secret_dir = tmp_path / "not-yours"
    res = client.post(
        SETS, json={"name": "x", "kind": "seta", "source": str(secret_dir)}, headers=h
    )
    assert res.status_code == 403 and res.json()["detail"].startswith("source:"), res.text
    assert not secret_dir.exists()
    res = client.post(SETS, json={"name": "x", "kind": "seta", "shared": True}, headers=h)
    assert res.status_code == 403 and res.json()["detail"].startswith("shared:")
    uri = client.post(
        SETS,
        json={"name": "hub", "kind": "swe-smith", "source": "hf://SWE-bench/SWE-smith"},
        headers=h,
    ).json()
    assert uri["origin"] == "uri" and uri["task_count"] is None
    up = client.post(SETS, json={"name": "mine", "kind": "terminal-bench"}, headers=h).json()
    assert up["origin"] == "upload" and up["source"] == ""
    for task in ("t1", "t2"):
        res = client.put(f"{SETS}/{up['id']}/files/{task}/task.yaml", content=b"x: 1\n", headers=h)
        assert res.status_code == 200, res.text
        assert res.json() == {"path": f"{task}/task.yaml", "size": 5}
    assert client.get(f"{SETS}/{up['id']}", headers=h).json()["task_count"] == 2
    for bad in ("../escape.txt", ".hidden/x", "a/../../b", "a//b"):
        res = client.put(f"{SETS}/{up['id']}/files/{bad}", content=b"x", headers=h)
        assert res.status_code in (404, 422), (bad, res.status_code, res.text)
    res = client.put(f"{SETS}/{up['id']}/files/..%2F..%2Fescape", content=b"x", headers=h)
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["path", "file_path"]
    assert not list(tmp_path.rglob("escape*"))
    # another token can neither read nor upload into it; a URI set takes no uploads
    assert client.get(f"{SETS}/{up['id']}", headers=other).status_code == 404
    res = client.put(f"{SETS}/{up['id']}/files/t3/task.yaml", content=b"x", headers=other)
    assert res.status_code == 404
    assert (
        client.put(f"{SETS}/{uri['id']}/files/a.jsonl", content=b"{}", headers=h).status_code == 409
    )
    assert client.delete(f"{SETS}/{up['id']}", headers=other).status_code == 404
    assert client.delete(f"{SETS}/{up['id']}", headers=h).status_code == 200


def test_shared_task_sets_are_visible_read_only(
    client: TestClient, admin: dict[str, str], new_token: Headers, tmp_path: Path
) -> None:
    h = new_token("u")
    body = {"name": "pub", "kind": "seta", "source": str(tmp_path), "shared": True}
    shared = client.post(SETS, json=body, headers=admin).json()
    assert client.get(SETS, headers=h).json()["count"] == 1
    assert client.get(f"{SETS}/{shared['id']}", headers=h).status_code == 200
    res = client.patch(f"{SETS}/{shared['id']}", json={"description": "mine"}, headers=h)
    assert res.status_code == 404
    assert client.delete(f"{SETS}/{shared['id']}", headers=h).status_code == 404


def test_task_set_kind_and_name_are_validated(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    bad_kind = client.post(SETS, json={"name": "x", "kind": "nope", "source": "s"}, headers=h)
    assert bad_kind.status_code == 422 and bad_kind.json()["detail"][0]["loc"] == ["body", "kind"]
    bad_name = client.post(SETS, json={"name": "a b/c", "kind": "seta", "source": "s"}, headers=h)
    assert bad_name.status_code == 422
