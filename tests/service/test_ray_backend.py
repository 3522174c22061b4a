"""The Ray launcher backend's code path (submit, status mapping, log copy, stop, adopt) driven
through a local stand-in for ray's JobSubmissionClient: it runs each job's entrypoint as a local
process, so the launcher logic is exercised without a Ray cluster (ray is an optional extra that
is not installed in the test venv). The stand-in is Ray's side, not the part under test."""

from __future__ import annotations

import os
import subprocess
from enum import Enum
from pathlib import Path

from fastapi.testclient import TestClient
from service_helpers import ADMIN_TOKEN, bearer, make_settings, wait_final, wait_for

from thundersync.service.launcher.ray_backend import RayJobBackend
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
    assert f"--run-dir {tmp_path}" in str(entry["entrypoint"])
    assert entry["metadata"] == {"tsrl_run_id": ok["id"]}
    assert ADMIN_TOKEN not in repr(client.submitted)
