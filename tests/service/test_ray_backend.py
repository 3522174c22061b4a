"""The Ray launcher backend's code path (submit, status mapping, log copy, stop, adopt) driven
through a local stand-in for ray's JobSubmissionClient: it runs each job's entrypoint as a local
process, so the launcher logic is exercised without a Ray cluster (ray is an optional extra that
is not installed in the test venv). The stand-in is Ray's side, not the part under test."""

from __future__ import annotations

import os
import shlex
import subprocess
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, wait_final, wait_for

from thundersync.cli import app
from thundersync.service.launcher.ray_backend import (
    JOB_RAY_ADDRESS,
    RayJobBackend,
    job_submission,
    ray_driver_command,
)
from thundersync.service.main import create_app


class JobStatus(str, Enum):  # noqa: UP042  (ray.job_submission.JobStatus is str + Enum)
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class LocalJobClient:
    """submit_job / get_job_status / get_job_logs / stop_job, run as local processes."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.jobs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: set[str] = set()
        self.submitted: list[dict[str, object]] = []

    def submit_job(
        self, *, entrypoint: str, submission_id: str, runtime_env: dict, metadata: dict
    ) -> str:
        self.submitted.append(
            {"entrypoint": entrypoint, "runtime_env": runtime_env, "metadata": metadata}
        )
        env = {**os.environ, **runtime_env.get("env_vars", {})}
        env.pop("TSRL_ADMIN_TOKEN", None)
        out = (self.log_dir / f"{submission_id}.log").open("wb")
        self.jobs[submission_id] = subprocess.Popen(
            ["bash", "-c", entrypoint], stdout=out, stderr=subprocess.STDOUT, env=env
        )
        return submission_id

    def get_job_status(self, job_id: str) -> JobStatus:
        code = self.jobs[job_id].poll()
        if code is None:
            return JobStatus.RUNNING
        if job_id in self.stopped:
            return JobStatus.STOPPED
        return JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED

    def get_job_logs(self, job_id: str) -> str:
        return (self.log_dir / f"{job_id}.log").read_text()

    def stop_job(self, job_id: str) -> bool:
        self.stopped.add(job_id)
        self.jobs[job_id].kill()
        self.jobs[job_id].wait()
        return True


def test_runs_go_through_ray_jobs(database_url: str, tmp_path: Path) -> None:
    settings = make_settings(database_url, tmp_path, launcher="ray")
    client = LocalJobClient(tmp_path)
    backend = RayJobBackend(settings.driver_command, None, client=client)
    h = bearer(ADMIN_TOKEN)
    with TestClient(create_app(settings, backend=backend)) as c:
        ok = c.post(
            "/api/v1/runs", json={"recipe": "grpo-toy", "overrides": {"updates": 2}}, headers=h
        ).json()
        bad = c.post("/api/v1/runs", json={"recipe": "grpo-toy", "name": "fail"}, headers=h).json()
        final_ok, final_bad = wait_final(c, ok["id"], h), wait_final(c, bad["id"], h)
        assert final_ok["status"] == "succeeded" and final_ok["backend"] == "ray"
        assert final_ok["updates_done"] == 2
        assert final_bad["status"] == "failed" and "failed on purpose" in final_bad["reason"]
        logs = c.get(f"/api/v1/runs/{ok['id']}/logs", headers=h).json()["text"]
        assert "update 1 done" in logs  # copied from the job's logs
        slow = c.post(
            "/api/v1/runs",
            json={"recipe": "grpo-toy", "name": "slow", "overrides": {"updates": 500}},
            headers=h,
        ).json()
        wait_for(
            lambda: c.get(f"/api/v1/runs/{slow['id']}", headers=h).json(),
            lambda r: r["updates_done"] >= 1,
        )
        c.post(f"/api/v1/runs/{slow['id']}/cancel", headers=h)
        assert wait_final(c, slow["id"], h)["status"] == "cancelled"
    entry = client.submitted[0]
    run_dir = settings.runs_dir / ok["id"]
    argv = driver_argv(str(entry["entrypoint"]))
    assert argv[argv.index("--run-dir") + 1] == str(run_dir) and run_dir.is_absolute()
    assert argv[argv.index("--ray") + 1] == "auto"
    assert entry["metadata"] == {"tsrl_run_id": ok["id"]}
    assert ADMIN_TOKEN not in repr(client.submitted)


def driver_argv(entrypoint: str) -> list[str]:
    """The driver's argv in the entrypoint `cd DIR && exec ARGV`."""
    cd, sep, cmd = entrypoint.partition(" && exec ")
    assert sep and cd.startswith("cd "), entrypoint
    return shlex.split(cmd)


def test_job_runs_the_driver_on_ray_with_absolute_paths(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs dir" / "r1"  # a space: the entrypoint is a shell line
    config = run_dir / "config.json"
    job = job_submission(ray_driver_command({}), "r1", config, run_dir)
    cd, _, _ = job["entrypoint"].partition(" && exec ")
    assert shlex.split(cd) == ["cd", str(run_dir)]  # cwd DIR, as the embedded backend
    argv = driver_argv(job["entrypoint"])
    assert argv == [
        "tsrl",
        "train",
        str(config),
        "--run-dir",
        str(run_dir),
        "--ray",
        JOB_RAY_ADDRESS,
    ]
    assert JOB_RAY_ADDRESS == "auto"  # the job's own cluster, not the dashboard URL
    # every option it passes is one the real `tsrl train` has
    cmd: Any = typer.main.get_command(app)
    opts = {o for p in cmd.commands["train"].params for o in p.opts}
    assert {a for a in argv if a.startswith("--")} <= opts
    # no entrypoint resources: the driver itself runs on the head, its GPUs come from placement
    assert not {k for k in job if k.startswith("entrypoint_")}
    assert job["submission_id"] == "tsrl-r1"
    assert job["runtime_env"]["env_vars"]["TSRL_RUN_ID"] == "r1"


def test_relative_paths_are_refused() -> None:
    with pytest.raises(ValueError, match="relative"):
        job_submission(["tsrl", "train"], "r1", Path("/data/runs/r1/config.json"), Path("runs/r1"))
    with pytest.raises(ValueError, match="relative"):
        job_submission(["tsrl", "train"], "r1", Path("config.json"), Path("/data/runs/r1"))


def test_ray_driver_command_is_the_nodes_tsrl() -> None:
    assert ray_driver_command({}) == ["tsrl", "train"]
    custom = {"TSRL_RAY_DRIVER_COMMAND": "/opt/venv/bin/python -m thundersync.cli train"}
    assert ray_driver_command(custom) == [
        "/opt/venv/bin/python",
        "-m",
        "thundersync.cli",
        "train",
    ]
