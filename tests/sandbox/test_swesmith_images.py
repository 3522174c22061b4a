"""SWE-smith instance images on the docker backend (podman's socket), and `tsrl data import`.

A tiny image in SWE-smith's layout is built once per machine (cached by a tag naming the
fixture's content hash) from the local base image, offline and with COPY steps only: the clean
minicalc repo at /testbed with a history that holds the fix (as a published image's clone holds
every instance branch), and a stand-in conda env `testbed` under /opt/miniconda3.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from thundersync.cli_data import import_records
from thundersync.sandbox.envs.check import check_swe
from thundersync.sandbox.envs.fixtures import (
    FIXTURE_IMAGE_PREFIX,
    SWESMITH_INSTANCES,
    ensure_swesmith_image,
)
from thundersync.sandbox.envs.swesmith import ImageMissing, RecordError, load_instances
from thundersync.sandbox.envs.swesmith_env import SWESmithEnv
from thundersync.sandbox.envs.swesmith_eval import eval_script
from thundersync.sandbox.envs.swesmith_profiles import (
    DEFAULT,
    SWESMITH_PYTHON,
    RepoProfile,
    profile_for,
    register,
    unregister,
)

INST = next(
    i for i in load_instances(SWESMITH_INSTANCES) if i.instance_id.startswith("minicalc__clamp")
)
IMAGE = f"{FIXTURE_IMAGE_PREFIX}minicalc.fixture"  # the shipped fixture image of minicalc


@pytest.fixture(scope="session")
def docker_executor() -> Any:
    from thundersync.sandbox.docker_backend import DockerExecutor

    return DockerExecutor()


@pytest.fixture(scope="session")
def image(docker_executor: Any) -> str:
    """minicalc in SWE-smith's layout, built from the local base image (COPY steps only): the
    clean repo at /testbed whose clone holds every instance branch (what must never leak), and a
    stand-in conda env `testbed` under /opt/miniconda3."""
    return ensure_swesmith_image(docker_executor.client, IMAGE)


def _record(tmp_path: Path, image_name: str) -> Path:
    rec = {
        "instance_id": INST.instance_id,
        "repo": INST.repo,
        "patch": INST.patch,
        "FAIL_TO_PASS": INST.fail_to_pass,
        "PASS_TO_PASS": INST.pass_to_pass,
        "image_name": image_name,
        "problem_statement": INST.problem_statement,
        "repos_dir": "no-mirrors",  # the image must be the only source
    }
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return path


def test_image_instance_gold_earns_1_noop_0(
    tmp_path: Path, docker_executor: Any, image: str
) -> None:
    inst = load_instances(_record(tmp_path, image))[0]
    out = check_swe(inst, docker_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out


def test_image_repo_is_the_buggy_tree_without_history_in_the_conda_env(
    tmp_path: Path, docker_executor: Any, image: str
) -> None:
    path = _record(tmp_path, image)
    extras = {"instance": INST.instance_id, "instances_path": str(path)}
    env = SWESmithEnv(extras=extras | {"executor": docker_executor})
    try:
        env.init()
        test_file = INST.fail_to_pass[0].split("::")[0]
        cmd = (
            "pwd; command -v python; git rev-list --all | wc -l; "
            f"grep -c 'x >= hi - 1' minicalc/ops.py; test -e {test_file} || echo hidden"
        )
        obs = env.step(f"<tool>bash\n{cmd}</tool>")["observations"][0]["content"]
        lines = obs.split()
        assert lines[:5] == [
            "/testbed",
            "/opt/miniconda3/envs/testbed/bin/python",
            "1",
            "1",
            "hidden",
        ], obs
    finally:
        env.close()


def test_missing_image_names_instance_image_and_fix(tmp_path: Path, docker_executor: Any) -> None:
    path = _record(tmp_path, "thundersync-swesmith-test:does-not-exist")
    extras = {"instance": INST.instance_id, "instances_path": str(path)}
    with pytest.raises(ImageMissing) as e:
        SWESmithEnv(extras=extras | {"executor": docker_executor})
    msg = str(e.value)
    assert INST.instance_id in msg and "does-not-exist" in msg and "pull" in msg, msg


def test_local_backend_ignores_image_name(tmp_path: Path) -> None:
    path = _record(tmp_path, "thundersync-swesmith-test:does-not-exist")
    with pytest.raises(RecordError, match="not used on the local backend"):
        SWESmithEnv(extras={"instance": INST.instance_id, "instances_path": str(path)})


def test_profiles_registry_defaults_and_swesmith_mirrors() -> None:
    assert profile_for("some/unknown-repo") is DEFAULT
    assert profile_for("swesmith/oauthlib__oauthlib.1fd52536") is SWESMITH_PYTHON
    cmd = profile_for(INST).command(["tests/a b.py"], "/logs/r/junit.xml")
    assert "--junitxml=/logs/r/junit.xml" in cmd and "'tests/a b.py'" in cmd
    custom = register(RepoProfile("custom", test_cmd="pytest -x"), "acme/custom-repo")
    try:
        assert profile_for("swesmith/acme__custom-repo.0123abcd") is custom
        script = eval_script(replace(INST, repo="acme/custom-repo"), "/logs/r/junit.xml")
        assert (  # pytest starts from the grader's launcher, beside the guard
            "python3 /logs/r/tsrl_run_pytest.py -x -p no:cacheprovider -p tsrl_pytest_guard "
            "--junitxml=/logs/r/junit.xml tests/" in script
        )
        assert "TSRL_GUARD_OUT=/logs/r/guard.json" in script
        assert "conda activate testbed" in script  # the image's env when it has one
    finally:
        unregister("acme/custom-repo")


# ---- tsrl data import swe-smith --------------------------------------------------------------
def _published(tmp_path: Path) -> Path:
    """Records as the published dataset has them: test lists as lists, extra fields kept."""
    recs = [
        {
            "instance_id": i.instance_id,
            "repo": i.repo,
            "patch": i.patch,
            "FAIL_TO_PASS": i.fail_to_pass,
            "PASS_TO_PASS": i.pass_to_pass,
            "image_name": i.image_name,
            "problem_statement": i.problem_statement,
            "created_at": "2025-01-01",
        }
        for i in load_instances(SWESMITH_INSTANCES)[:2]
    ]
    path = tmp_path / "dataset.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_importer_writes_a_loadable_task_set(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    n = import_records(_published(tmp_path), out, repos_dir=tmp_path)
    loaded = load_instances(out)
    assert n == len(loaded) == 2 and all(i.repos_dir == "." for i in loaded)
    with pytest.raises(RecordError, match="outside"):
        import_records(_published(tmp_path), out, repos_dir=tmp_path.parent)


def test_record_repos_dir_stays_inside_its_task_set(tmp_path: Path) -> None:
    path = _record(tmp_path, "")
    path.write_text(path.read_text().replace('"no-mirrors"', '"../elsewhere"'))
    with pytest.raises(RecordError, match="'repos_dir' must be a relative path"):
        SWESmithEnv(extras={"instance": INST.instance_id, "instances_path": str(path)})


def test_importer_names_line_and_field_of_a_bad_record(tmp_path: Path) -> None:
    src = _published(tmp_path)
    lines = src.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["FAIL_TO_PASS"]
    src.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError) as e:
        import_records(src, tmp_path / "tasks.jsonl")
    assert f"{src}:2" in str(e.value) and "FAIL_TO_PASS" in str(e.value)
    assert not (tmp_path / "tasks.jsonl").exists()  # nothing half-written


def test_importer_cli_and_parquet_without_pyarrow(tmp_path: Path) -> None:
    from thundersync.cli_groups import app

    out = tmp_path / "tasks.jsonl"
    args = ["data", "import", "swe-smith", str(_published(tmp_path)), "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and len(load_instances(out)) == 2, r.output
    pq = tmp_path / "dataset.parquet"
    pq.write_bytes(b"PAR1")
    r = CliRunner().invoke(app, ["data", "import", "swe-smith", str(pq), "--out", str(out)])
    assert r.exit_code == 1 and str(pq) in r.output, r.output
    if importlib.util.find_spec("pyarrow") is None:
        assert "pip install pyarrow" in r.output, r.output


def test_importer_reads_parquet_and_names_the_bad_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    recs = [json.loads(line) for line in _published(tmp_path).read_text().splitlines()]
    path = tmp_path / "dataset.parquet"
    pq.write_table(pa.Table.from_pylist(recs), path)
    assert import_records(path, tmp_path / "ok.jsonl") == 2
    recs[1]["patch"] = ""
    pq.write_table(pa.Table.from_pylist(recs), path)
    with pytest.raises(RecordError, match=r"\[row 1\].*'patch'"):
        import_records(path, tmp_path / "bad.jsonl")


def test_base_image_record_runs_on_docker_from_the_mirror(docker_executor: Any) -> None:
    # the fixture names the base image, which has no /testbed: its repo comes from the mirror
    out = check_swe(INST, docker_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
