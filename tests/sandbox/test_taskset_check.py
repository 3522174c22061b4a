"""The task-set check before a run starts (`sandbox.envs.taskset_check`), SWE-smith record
validation, the published -> local image map (`sandbox.images`), `tsrl env check --json` and
`tsrl train`'s refusal. Images: the real podman engine; nothing leaves loopback."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from thundersync.cli_data import import_records
from thundersync.config import load_run_config
from thundersync.config_env import EnvConfig
from thundersync.sandbox import images
from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, TERMINAL_DIR
from thundersync.sandbox.envs.swesmith import RecordError, load_instances
from thundersync.sandbox.envs.taskset_check import (
    SET,
    TaskSetError,
    check_task_set,
    record_problem,
    require_runnable,
)

INST = load_instances(SWESMITH_INSTANCES)[0]
BASE = "thundersync-sandbox:bookworm"


def _set(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "set"
    for name in names:
        shutil.copytree(TERMINAL_DIR / name, root / name)
    return root


def _cfg(**env: Any) -> Any:
    return load_run_config("grpo-toy", {f"env.{k}": v for k, v in env.items()})


def _record(tmp_path: Path, **fields: Any) -> Path:
    rec = {
        "instance_id": INST.instance_id,
        "repo": INST.repo,
        "patch": INST.patch,
        "FAIL_TO_PASS": INST.fail_to_pass,
        "PASS_TO_PASS": INST.pass_to_pass,
        "image_name": "",
        "problem_statement": "Fix clamp.",
    } | fields
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return path


def test_a_docker_only_task_is_refused_on_local_naming_the_task_and_why(tmp_path: Path) -> None:
    root = _set(tmp_path, "tb1-hello-file", "tb1-image-seed")
    problems, total = check_task_set(_cfg(name="terminal", tasks=str(root)))
    assert total == 2 and [p.task for p in problems] == ["tb1-image-seed"]
    assert "docker backend" in problems[0].reason and "Dockerfile:3" in problems[0].reason
    with pytest.raises(TaskSetError) as e:
        require_runnable(_cfg(name="terminal", tasks=str(root)))
    assert "1 of 2 task(s) cannot run on the local backend" in str(e.value)
    assert "'tb1-image-seed'" in str(e.value)
    # the docker backend builds it: statically fine (its images are checked with an engine)
    assert check_task_set(_cfg(name="terminal", tasks=str(root), sandbox="docker")) == ([], 2)
    # the built-in sets and the default fixtures (local leaves the docker-only ones out) pass
    assert check_task_set(_cfg(name="terminal", tasks="terminal-easy")) == ([], 5)
    assert check_task_set(_cfg(name="terminal"))[0] == []
    assert check_task_set(_cfg(name="swe-smith"))[0] == []


def test_broken_verifiers_and_task_files_are_refused(tmp_path: Path) -> None:
    root = _set(tmp_path, "tb1-hello-file", "harbor-sort-unique", "tb1-default-runner")
    (root / "tb1-hello-file" / "run-tests.sh").write_text("#!/bin/bash\nif then fi (\n")
    (root / "tb1-default-runner" / "tests" / "test_outputs.py").unlink()
    (root / "harbor-sort-unique" / "task.toml").write_text("[verifier\n")
    problems = {p.task: p.reason for p in check_task_set(_cfg(name="terminal", tasks=str(root)))[0]}
    assert set(problems) == {"tb1-hello-file", "harbor-sort-unique", "tb1-default-runner"}
    assert "run-tests.sh: not a valid shell script (`bash -n`" in problems["tb1-hello-file"]
    assert "test_outputs.py: missing" in problems["tb1-default-runner"]
    assert "task.toml" in problems["harbor-sort-unique"]
    one = check_task_set(_cfg(name="terminal", tasks=str(root / "tb1-hello-file")))[0]
    assert one[0].task == SET and "is one task" in one[0].reason
    gone = check_task_set(_cfg(name="terminal", tasks=str(tmp_path / "nowhere")))[0]
    assert gone[0].task == SET and "nowhere" in gone[0].reason


def test_swe_records_null_statement_unknown_repo_and_no_mirror(tmp_path: Path) -> None:
    path = _record(tmp_path, problem_statement=None)
    with pytest.raises(RecordError) as e:
        load_instances(path)
    assert f"{path}:1" in str(e.value) and "'problem_statement'" in str(e.value)
    assert "null" in str(e.value)
    with pytest.raises(RecordError, match=rf"{path}:1: field 'problem_statement'"):
        import_records(path, tmp_path / "out" / "tasks.jsonl")
    assert not (tmp_path / "out").exists()  # `tsrl data import` wrote nothing
    unknown = _record(tmp_path, repo="acme/widget", image_name="acme/widget:1")
    with pytest.raises(RecordError, match=rf"{unknown}:1: field 'repo' 'acme/widget'"):
        import_records(unknown, tmp_path / "out" / "tasks.jsonl")
    for backend in ("local", "docker"):
        cfg = _cfg(name="swe-smith", tasks=str(unknown), sandbox=backend)
        problems = check_task_set(cfg)[0]
        assert problems[0].task == INST.instance_id and f"{unknown}:1" in problems[0].reason
        assert "field 'repo' 'acme/widget' has no repository profile" in problems[0].reason
    # a SWE-smith mirror name is known (the generic Python profile); a repo without image too
    mirror_name = "swesmith/acme__widget.0123abcd"
    assert (
        record_problem(load_instances(_record(tmp_path, repo=mirror_name, image_name="x"))[0])
        is None
    )
    assert record_problem(load_instances(_record(tmp_path, repo="acme/widget"))[0]) is None
    # local backend: the image is not used, and the record's mirror is not there
    no_mirror = _record(tmp_path, image_name="some-image:1", repos_dir="no-mirrors")
    problems = check_task_set(_cfg(name="swe-smith", tasks=str(no_mirror)))[0]
    assert problems[0].task == INST.instance_id
    assert (
        "has no git mirror" in problems[0].reason and "not used on the local" in problems[0].reason
    )


def test_the_image_map_entries_and_lookup() -> None:
    table = {
        "ghcr.io/laude-institute/t-bench/*": "localhost/t-bench/*",
        "ghcr.io/laude-institute/t-bench/python-3-13:*": BASE,
        "swesmith.x86_64.acme__widget.0123abcd": "local/widget:1",
    }
    assert images.mapped("swesmith.x86_64.acme__widget.0123abcd", table) == "local/widget:1"
    assert images.mapped("ghcr.io/laude-institute/t-bench/python-3-13:20250620", table) == BASE
    got = images.mapped("ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest", table)
    assert got == "localhost/t-bench/ubuntu-24-04:latest"  # the longest prefix, rest carried
    assert images.mapped("docker.io/library/python:3.13", table) is None
    assert EnvConfig(image_map=table).image_map == table
    for bad in ({"a b": "c"}, {"a": "b*"}, {"*x": "y"}):
        with pytest.raises(ValueError, match="env.image_map"):
            EnvConfig(image_map=bad)


# ---- the engine (podman's docker-compatible socket) --------------------------------------------
@pytest.fixture(scope="module")
def client() -> Any:
    from thundersync.sandbox.docker_backend import DockerExecutor

    return DockerExecutor().client


@pytest.fixture
def published(client: Any) -> Iterator[str]:
    """A published-looking base image name that no machine has; its tags removed afterwards."""
    name = f"ghcr.io/laude-institute/t-bench/tsrl-test-{uuid.uuid4().hex[:8]}:20250620"
    yield name
    with contextlib.suppress(Exception):
        client.images.remove(name)


def _task_on(tmp_path: Path, base: str) -> Path:
    root = _set(tmp_path, "tb1-hello-file")
    (root / "tb1-hello-file" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    return root


def test_a_missing_published_base_names_the_image_the_map_and_the_fix(
    tmp_path: Path, client: Any, published: str
) -> None:
    cfg = _cfg(name="terminal", tasks=str(_task_on(tmp_path, published)), sandbox="docker")
    problems, _ = check_task_set(cfg, client, prepare=True)
    reason = problems[0].reason
    assert problems[0].task == "tb1-hello-file" and f"base image {published!r}" in reason
    assert "not present locally" in reason and "env.image_map" in reason
    assert "--image-map" in reason and "podman load" in reason
    mapped_to_nothing = cfg.model_copy(
        update={"env": cfg.env.model_copy(update={"image_map": {published: "tsrl-none:0"}})}
    )
    reason = check_task_set(mapped_to_nothing, client, prepare=True)[0][0].reason
    assert "mapped to 'tsrl-none:0' by env.image_map" in reason


def test_a_mapped_base_is_tagged_locally_and_builds_offline(
    tmp_path: Path, client: Any, published: str
) -> None:
    prefix = published.rsplit("/", 1)[0] + "/*"
    env = {"name": "terminal", "sandbox": "docker", "image_map": {prefix: BASE}}
    cfg = _cfg(**env, tasks=str(_task_on(tmp_path, published)))
    assert check_task_set(cfg, client, prepare=False) == ([], 1)
    assert images._missing_base(client, published)  # a check alone changes nothing
    assert require_runnable(cfg, client, prepare=True) == 1
    assert client.images.get(published).id == client.images.get(BASE).id
    # this process's builds use the same map: the task image gets a tag of its own
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {published}\nLABEL tsrl.test=map\n")
    tag = images.ensure_image(client, "mapped", context, context / "Dockerfile")
    try:
        plain = images.image_tag("mapped", images.context_hash(context, context / "Dockerfile"))
        assert tag != plain and not images._missing_base(client, tag)
    finally:
        client.images.remove(tag, force=True)
        images.configure()


def test_a_pull_that_fails_names_the_image_and_the_map(client: Any) -> None:
    image = "127.0.0.1:1/tsrl/none:1"  # loopback, nothing listens: the pull path, no network
    with pytest.raises(images.ImageBuildError) as e:
        images.ensure_present(client, image, "test image", pull=True)
    assert f"test image {image!r} is not present locally and pulling it failed" in str(e.value)
    assert "env.image_map" in str(e.value)
    # pull allowed but not applied (the submission check): left to the start of the run
    assert images.ensure_present(client, image, "x", pull=True, apply=False) is None


def test_a_missing_swe_image_is_refused_before_the_run(tmp_path: Path, client: Any) -> None:
    image = f"swesmith.x86_64.thundersync-none__minicalc.{uuid.uuid4().hex[:8]}"
    path = _record(tmp_path, image_name=image)
    problems, _ = check_task_set(_cfg(name="swe-smith", tasks=str(path), sandbox="docker"), client)
    assert problems[0].task == INST.instance_id
    assert f"{path}:1: field 'image_name': image {image!r} is not present" in problems[0].reason
    assert "env.image_map" in problems[0].reason


# ---- the CLIs ----------------------------------------------------------------------------------
def _env_check(*args: str) -> tuple[int, Any]:
    cmd = [sys.executable, "-m", "thundersync.cli", "env", "check", *args, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, json.loads(r.stdout)  # exactly one JSON document, errors included


def test_env_check_json_is_one_object_errors_included(tmp_path: Path) -> None:
    code, out = _env_check(str(TERMINAL_DIR / "tb1-image-seed"))
    assert code == 1 and out["ok"] is False and out["tasks"] == 0 and out["backend"] == "local"
    assert "cannot run on the local backend" in out["skipped"][0]["reason"]
    code, out = _env_check(str(tmp_path))
    assert code == 2 and out["ok"] is False and "expected task.yaml" in out["error"]
    code, out = _env_check("--hacks", str(tmp_path))
    assert code == 2 and "--hacks" in out["error"]
    code, out = _env_check("--image-map", "nothing-to-map")
    assert code == 2 and "PUBLISHED=LOCAL" in out["error"]
    bad = _record(tmp_path, problem_statement=None)
    code, out = _env_check(str(bad))
    assert code == 2 and f"{bad}:1" in out["error"] and "problem_statement" in out["error"]
    unknown = _record(tmp_path, repo="acme/widget", image_name="acme/widget:1")
    code, out = _env_check(str(unknown))
    assert code == 2 and f"{unknown}:1: field 'repo'" in out["error"] and not out["ok"]


def test_train_refuses_an_unrunnable_set_before_anything_starts(tmp_path: Path) -> None:
    from thundersync.cli import app

    root = _set(tmp_path, "tb1-hello-file", "tb1-image-seed")
    run_dir = tmp_path / "run"
    args = ["train", "grpo-toy", "--run-dir", str(run_dir), "--quiet"]
    args += ["--set", "env.name=terminal", "--set", f"env.tasks={root}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "task 'tb1-image-seed'" in r.output and "docker backend" in r.output
    assert not run_dir.exists()  # nothing started, nothing written
