"""Artifacts instead of host paths: a run config names models and task sets the token may use
(its own, or shared by an admin); a host path or another token's artifact is a 4xx naming the
field, and the path is never touched (no stat, no open, no listing: watched below)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, TERMINAL_DIR

Headers = Callable[[str], dict[str, str]]
RUNS, MODELS, SETS = "/api/v1/runs", "/api/v1/models", "/api/v1/task-sets"
MARKER = "tsrl-never-touch"


@pytest.fixture
def touched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path containing MARKER that the process stats, opens or lists during the test."""
    seen: list[str] = []
    armed = [True]

    def note(path: Any) -> None:
        if armed[0] and isinstance(path, str | bytes | os.PathLike) and MARKER in str(path):
            seen.append(str(path))

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args:
            note(args[0])

    sys.addaudithook(hook)  # audit hooks cannot be removed: disarmed after the test
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def watched(path: Any, *a: Any, _real: Any = real, **kw: Any) -> Any:
            note(path)
            return _real(path, *a, **kw)

        monkeypatch.setattr(os, name, watched)
    yield seen
    armed[0] = False


def _run(client: TestClient, h: dict[str, str], **config: Any) -> Any:
    return client.post(RUNS, json={"recipe": "grpo-toy", "config": config}, headers=h)


def _field_422(res: Any, *field: str) -> str:
    assert res.status_code == 422, res.text
    err = res.json()["detail"][0]
    assert err["loc"] == ["body", "config", *field], err
    assert err["msg"].startswith(".".join(field) + ":"), err
    return str(err["msg"])


def _upload_model(client: TestClient, h: dict[str, str], name: str) -> dict[str, Any]:
    model = client.post(MODELS, json={"name": name}, headers=h).json()
    res = client.put(f"{MODELS}/{model['id']}/files/config.json", content=b"{}", headers=h)
    assert res.status_code == 200, res.text
    return dict(model)


def test_host_paths_in_a_run_config_are_refused_untouched(
    client: TestClient, new_token: Headers, tmp_path: Path, touched: list[str]
) -> None:
    h = new_token("u")
    target = tmp_path / MARKER
    target.mkdir()
    (target / "config.json").write_text("{}")
    touched.clear()  # the test's own set-up
    for value in (str(target), f"../{MARKER}", f"~/{MARKER}", f"/etc/{MARKER}"):
        msg = _field_422(_run(client, h, model={"path": value}), "model", "path")
        assert "does not read host paths" in msg
    opd = {"objective": "opd", "teacher": {"model": str(target)}}
    _field_422(_run(client, h, **opd), "teacher", "model")
    tasks = {"env": {"name": "terminal", "tasks": str(target)}}
    _field_422(_run(client, h, **tasks), "env", "tasks")
    rows = {"env": {"name": "skyrl-dataset", "tasks": str(target / "train.jsonl")}}
    _field_422(_run(client, h, **rows), "env", "tasks")  # a SkyRL dataset: a task set too
    res = client.post(
        RUNS, json={"recipe": "grpo-toy", "overrides": {"model.path": str(target)}}, headers=h
    )
    _field_422(res, "model", "path")
    # registering a host path is an admin's job: 403 naming the field, nothing looked at
    res = client.post(MODELS, json={"name": "m", "path": str(target)}, headers=h)
    assert res.status_code == 403 and res.json()["detail"].startswith("path:"), res.text
    res = client.post(SETS, json={"name": "t", "kind": "seta", "source": str(target)}, headers=h)
    assert res.status_code == 403 and res.json()["detail"].startswith("source:"), res.text
    assert touched == [], touched
    assert client.get(RUNS, headers=h).json()["count"] == 0


def test_only_an_admin_may_attach_a_run_to_running_vllm_servers(
    client: TestClient, new_token: Headers, admin: dict[str, str]
) -> None:
    """`rollout.vllm.urls` makes the service's driver call those URLs: not a user's to set."""
    rollout = {"engine": "vllm", "replicas": 1, "vllm": {"urls": ["http://10.0.0.9:8000"]}}
    msg = _field_422(_run(client, new_token("u"), rollout=rollout), "rollout", "vllm", "urls")
    assert "only an admin" in msg
    assert _run(client, admin, rollout=rollout).status_code == 201


def test_a_second_user_cannot_use_the_first_ones_artifacts(
    client: TestClient, new_token: Headers
) -> None:
    alice, bob = new_token("alice"), new_token("bob")
    model = _upload_model(client, alice, "weights")
    tasks = client.post(SETS, json={"name": "mine", "kind": "seta"}, headers=alice).json()
    task = TERMINAL_DIR / "tb1-hello-file"  # a runnable task: POST /runs checks the set
    for f in ("task.yaml", "run-tests.sh", "solution.sh", "tests/test_outputs.py"):
        url = f"{SETS}/{tasks['id']}/files/t1/{f}"
        client.put(url, content=(task / f).read_bytes(), headers=alice)
    # alice: by name and by id; the stored config holds the artifact's path in the data dir
    own = _run(client, alice, model={"path": "weights"})
    assert own.status_code == 201, own.text
    path = own.json()["config"]["model"]["path"]
    assert path.endswith(f"artifacts/models/{model['id']}") and Path(path, "config.json").is_file()
    assert _run(client, alice, model={"path": model["id"]}).status_code == 201
    assert _run(client, alice, model={"path": path}).status_code == 201  # a config given back
    run = _run(client, alice, env={"name": "terminal", "tasks": "mine"})
    assert run.status_code == 201, run.text
    tasks_path = run.json()["config"]["env"]["tasks"]
    # bob: neither the name, nor the id, nor the path in the data dir reaches alice's artifacts
    for ref in ("weights", model["id"]):
        msg = _field_422(_run(client, bob, model={"path": ref}), "model", "path")
        assert "not visible" in msg
        opd = {"objective": "opd", "teacher": {"model": ref}}
        _field_422(_run(client, bob, **opd), "teacher", "model")
    _field_422(_run(client, bob, model={"path": path}), "model", "path")
    for ref in ("mine", tasks["id"], tasks_path):
        _field_422(_run(client, bob, env={"name": "terminal", "tasks": ref}), "env", "tasks")
    assert client.get(f"{MODELS}/{model['id']}", headers=bob).status_code == 404
    assert client.get(MODELS, headers=bob).json()["count"] == 0
    res = client.put(f"{MODELS}/{model['id']}/files/config.json", content=b"x", headers=bob)
    assert res.status_code == 404
    assert client.delete(f"{MODELS}/{model['id']}", headers=bob).status_code == 404
    assert client.get(RUNS, headers=bob).json()["count"] == 0
    # bob's own model of the same name is his: no clash, his path
    mine = _upload_model(client, bob, "weights")
    res = _run(client, bob, model={"path": "weights"})
    assert res.status_code == 201 and res.json()["config"]["model"]["path"].endswith(mine["id"])


def test_shared_artifacts_and_builtins(
    client: TestClient, admin: dict[str, str], new_token: Headers, tmp_path: Path
) -> None:
    h = new_token("u")
    host = tmp_path / "admin-weights"
    res = client.post(
        MODELS, json={"name": "base", "path": str(host), "shared": True}, headers=admin
    )
    assert res.status_code == 201 and res.json()["origin"] == "host", res.text
    run = _run(client, h, model={"path": "base"})
    assert run.status_code == 201 and run.json()["config"]["model"]["path"] == str(host)
    assert _run(client, h, model={"path": str(host)}).status_code == 201  # given back
    assert client.delete(f"{MODELS}/{res.json()['id']}", headers=h).status_code == 404
    # built in: smollm2 as the teacher, the fixtures without env.tasks, the tiny model
    opd = _run(client, h, objective="opd", teacher={"model": "smollm2"})
    assert opd.status_code == 201 and opd.json()["config"]["teacher"]["model"] == "smollm2"
    assert _run(client, h, env={"name": "terminal"}).status_code == 201
    # the shipped SmolLM2 recipe: its policy and its task set are built-in names, not host paths
    sm = client.post(RUNS, json={"recipe": "grpo-smollm2-terminal"}, headers=h)
    assert sm.status_code == 201, sm.text
    config = sm.json()["config"]
    assert config["model"]["path"] == "smollm2" and config["env"]["tasks"] == "terminal-easy"
    listed = client.get(RUNS, params={"recipe": "grpo-smollm2-terminal"}, headers=h).json()
    assert [r["id"] for r in listed["data"]] == [sm.json()["id"]]


def test_task_set_must_fit_the_env_and_have_tasks(
    client: TestClient, admin: dict[str, str], new_token: Headers
) -> None:
    h = new_token("u")
    swe = client.post(SETS, json={"name": "swe", "kind": "swe-smith"}, headers=h).json()
    msg = _field_422(_run(client, h, env={"name": "terminal", "tasks": "swe"}), "env", "tasks")
    assert "swe-smith set" in msg
    msg = _field_422(_run(client, h, env={"name": "swe-smith", "tasks": "swe"}), "env", "tasks")
    assert "no tasks are uploaded" in msg
    record = SWESMITH_INSTANCES.read_text().splitlines()[0] + "\n"  # POST /runs checks the set
    client.put(f"{SETS}/{swe['id']}/files/instances.jsonl", content=record.encode(), headers=h)
    res = _run(client, h, env={"name": "swe-smith", "tasks": "swe"})
    assert res.status_code == 201, res.text
    assert res.json()["config"]["env"]["tasks"].endswith(f"{swe['id']}/instances.jsonl")
    body = {"name": "hub", "kind": "swe-smith", "source": "hf://x/y"}
    client.post(SETS, json=body, headers=h)
    msg = _field_422(_run(client, h, env={"name": "swe-smith", "tasks": "hub"}), "env", "tasks")
    assert "dataset URI" in msg


def test_model_uploads_are_checked(client: TestClient, new_token: Headers) -> None:
    h = new_token("u")
    model = client.post(MODELS, json={"name": "m"}, headers=h).json()
    assert model["origin"] == "upload" and model["path"] is None
    dup = client.post(MODELS, json={"name": "m"}, headers=h)
    assert dup.status_code == 409
    res = client.put(f"{MODELS}/{model['id']}/files/sub/..%2F..%2Fx", content=b"x", headers=h)
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["path", "file_path"]
    ok = client.put(f"{MODELS}/{model['id']}/files/tokenizer.json", content=b"{}", headers=h)
    assert ok.status_code == 200 and ok.json() == {"path": "tokenizer.json", "size": 2}
    clash = client.put(f"{MODELS}/{model['id']}/files/tokenizer.json/x", content=b"x", headers=h)
    assert clash.status_code == 409
    assert client.delete(f"{MODELS}/{model['id']}", headers=h).status_code == 200
    assert _run(client, h, model={"path": "m"}).status_code == 422
