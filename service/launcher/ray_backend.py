"""Cluster backend: each run is a Ray job (ray.job_submission.JobSubmissionClient).

The driver command is the same `tsrl train CONFIG --run-dir DIR`; DIR must be on a filesystem the
service and the Ray workers share (the launcher reads metrics/spans from it and cancels through
DIR/CANCEL). The job's logs are copied into DIR/output.log. `ray` is an optional extra
(`pip install -e '.[ray]'`) and is imported only when this backend is selected.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from thundersync.rundir import RunFiles
from thundersync.service.launcher.backends import Handle

LOG_COPY_EVERY_S = 5.0
_EXIT = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": -15}


class RayJobHandle:
    adopted = False

    def __init__(self, client: Any, job_id: str, run_dir: Path) -> None:
        self.client = client
        self.job_id = job_id
        self.run_dir = run_dir
        self._logs_at = 0.0

    def _copy_logs(self) -> None:
        try:
            logs = self.client.get_job_logs(self.job_id)
        except Exception:  # the job server may be briefly unreachable; logs are best effort
            return
        RunFiles(self.run_dir).output_log.write_text(logs)

    def poll(self) -> int | None:
        status = str(self.client.get_job_status(self.job_id)).rsplit(".", 1)[-1]
        if status in _EXIT:
            self._copy_logs()
            return _EXIT[status]
        now = time.monotonic()
        if now - self._logs_at >= LOG_COPY_EVERY_S:
            self._logs_at = now
            self._copy_logs()
        return None

    def kill(self) -> None:
        self.client.stop_job(self.job_id)

    def describe(self) -> tuple[int | None, str | None]:
        return None, self.job_id


class RayJobBackend:
    name = "ray"

    def __init__(self, driver_command: list[str], address: str | None, client: Any = None) -> None:
        """`client`: a JobSubmissionClient (made from `address` when None)."""
        self.driver_command = driver_command
        if client is not None:
            self.client = client
            return
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as err:
            raise RuntimeError(
                "launcher 'ray' needs the ray package: pip install -e '.[ray]' "
                "(or use --launcher embedded)"
            ) from err
        self.client = JobSubmissionClient(address or "http://127.0.0.1:8265")

    def start(self, run_id: str, config_path: Path, run_dir: Path) -> Handle:
        cmd = [*self.driver_command, str(config_path), "--run-dir", str(run_dir)]
        job_id = self.client.submit_job(
            entrypoint=shlex.join(cmd),
            submission_id=f"tsrl-{run_id}",
            runtime_env={"env_vars": {"PYTHONUNBUFFERED": "1", "TSRL_RUN_ID": run_id}},
            metadata={"tsrl_run_id": run_id},
        )
        return RayJobHandle(self.client, job_id, run_dir)

    def adopt(self, pid: int | None, job_id: str | None, run_dir: str) -> Handle | None:
        if job_id is None:
            return None
        try:
            self.client.get_job_status(job_id)
        except Exception:
            return None
        return RayJobHandle(self.client, job_id, Path(run_dir))
