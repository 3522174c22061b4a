"""POST /runs refuses a run whose task set holds a task its backend cannot run: a 422 in the
validation-error shape, one error per task naming it and the reason, and no run row written
(SQLite and PostgreSQL, through uploaded task sets)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, TERMINAL_DIR

Headers = Callable[[str], dict[str, str]]
RUNS, SETS = "/api/v1/runs", "/api/v1/task-sets"
LOC = ["body", "config", "env", "tasks"]


def _upload(
    client: TestClient, h: dict[str, str], name: str, kind: str, files: dict[str, bytes]
) -> None:
    row = client.post(SETS, json={"name": name, "kind": kind}, headers=h).json()
    for rel, data in files.items():
        res = client.put(f"{SETS}/{row['id']}/files/{rel}", content=data, headers=h)
        assert res.status_code == 200, res.text


def _task_files(*names: str) -> dict[str, bytes]:
    out = {}
    for name in names:
        for p in sorted((TERMINAL_DIR / name).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[f"{name}/{p.relative_to(TERMINAL_DIR / name)}"] = p.read_bytes()
    return out


def _run(client: TestClient, h: dict[str, str], **env: Any) -> Any:
    return client.post(RUNS, json={"recipe": "grpo-toy", "config": {"env": env}}, headers=h)


def _errors(res: Any) -> list[dict[str, Any]]:
    assert res.status_code == 422, res.text
    detail = res.json()["detail"]
    assert all(e["loc"] == LOC and e["type"] == "task_set_error" for e in detail), detail
    return list(detail)


def test_a_docker_only_task_on_local_is_refused_at_submission(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    _upload(client, h, "mixed", "seta", _task_files("tb1-hello-file", "tb1-image-seed"))
    errors = _errors(_run(client, h, name="terminal", tasks="mixed"))
    assert len(errors) == 1, errors
    msg = errors[0]["msg"]
    assert msg.startswith("env.tasks: task 'tb1-image-seed' cannot run on the local backend")
    assert "(1 of 2 cannot)" in msg and "Dockerfile:3" in msg and "env.sandbox=docker" in msg
    assert client.get(RUNS, headers=h).json()["count"] == 0  # nothing queued
    ok = _run(client, h, name="terminal", tasks="mixed", sandbox="docker")
    assert ok.status_code == 201, ok.text
    _upload(client, h, "fine", "seta", _task_files("tb1-hello-file"))
    assert _run(client, h, name="terminal", tasks="fine").status_code == 201


def test_malformed_tasks_and_records_are_refused_naming_file_and_field(
    client: TestClient, new_token: Headers
) -> None:
    h = new_token("u")
    files = _task_files("tb1-hello-file") | {"broken/task.yaml": b"x: 1\n"}
    _upload(client, h, "broken", "seta", files)
    errors = _errors(_run(client, h, name="terminal", tasks="broken"))
    assert len(errors) == 1 and "task 'broken' cannot run on the local backend" in errors[0]["msg"]
    assert "task.yaml: field 'instruction'" in errors[0]["msg"]
    rec = json.loads(SWESMITH_INSTANCES.read_text().splitlines()[0]) | {"problem_statement": None}
    _upload(client, h, "swe", "swe-smith", {"instances.jsonl": (json.dumps(rec) + "\n").encode()})
    errors = _errors(_run(client, h, name="swe-smith", tasks="swe"))
    assert "instances.jsonl:1: field 'problem_statement'" in errors[0]["msg"], errors
    assert client.get(RUNS, headers=h).json()["count"] == 0
