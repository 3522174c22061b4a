"""Cluster backend: each run is a Ray job (ray.job_submission.JobSubmissionClient).

The job's entrypoint is `cd DIR && exec tsrl train CONFIG --run-dir DIR --ray auto`: the driver
joins the cluster its job runs in (`auto`: RAY_ADDRESS, which Ray sets for a job) and places its
learner ranks and vLLM replicas in the GPU bundles of the run's `placement` (cluster/ray_plan.py),
which only GPU workers can hold. The entrypoint asks Ray for no resources, so the driver itself
runs on the head (`num-gpus 0`). DIR and CONFIG must be absolute paths on a filesystem the service
and every Ray node mount at the same path (deploy/: the tsrl-data volume at /data): the launcher
reads metrics/spans from DIR and cancels through DIR/CANCEL, learner rank 0 writes weights there,
and a job's working directory is not the service's. The job's logs are copied into
DIR/output.log. `ray` is an optional extra (`pip install -e '.[ray]'`) and is imported only when
this backend is selected.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thundersync.rundir import RunFiles
from thundersync.service.launcher.backends import Handle

LOG_COPY_EVERY_S = 5.0
_EXIT = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": -15}
# What the driver passes to ray.init inside its job: the job's own cluster (Ray sets RAY_ADDRESS
# for a job's entrypoint), never the dashboard URL the service submits to.
JOB_RAY_ADDRESS = "auto"
# The driver command on the Ray nodes: `tsrl` on their PATH (every image puts /opt/venv/bin
# there), not the service's own interpreter path, which a node need not have.
RAY_DRIVER_COMMAND = ("tsrl", "train")


def ray_driver_command(env: Mapping[str, str] | None = None) -> list[str]:
    """The driver command for Ray jobs: TSRL_RAY_DRIVER_COMMAND (shell words), else `tsrl train`."""
    value = (os.environ if env is None else env).get("TSRL_RAY_DRIVER_COMMAND", "").strip()
    return shlex.split(value) if value else list(RAY_DRIVER_COMMAND)


def job_submission(
    driver_command: list[str],
    run_id: str,
    config_path: Path,
    run_dir: Path,
    *,
    ray_address: str = JOB_RAY_ADDRESS,
) -> dict[str, Any]:
    """The keyword arguments of `JobSubmissionClient.submit_job` for one run.

    Raises ValueError for a relative CONFIG or DIR: the entrypoint runs on another machine, in a
    working directory of Ray's choosing, where a relative path names nothing the service wrote."""
    for what, path in (("run directory", run_dir), ("config", config_path)):
        if not Path(path).is_absolute():
            raise ValueError(
                f"{what} {str(path)!r} is relative: a Ray job runs on the cluster, so it needs an "
                "absolute path on storage every node mounts (set the service's --data-dir / "
                "TSRL_DATA_DIR to that mount, e.g. /data)"
            )
    train = [*driver_command, str(config_path), "--run-dir", str(run_dir), "--ray", ray_address]
    # cwd DIR, as the embedded backend runs it (docs/CONTRACTS.md, "What the service adds")
    entrypoint = f"cd {shlex.quote(str(run_dir))} && exec {shlex.join(train)}"
    return {
        "entrypoint": entrypoint,
        "submission_id": f"tsrl-{run_id}",
        "runtime_env": {"env_vars": {"PYTHONUNBUFFERED": "1", "TSRL_RUN_ID": run_id}},
        "metadata": {"tsrl_run_id": run_id},
    }


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
        job = job_submission(self.driver_command, run_id, config_path, run_dir)
        job_id = self.client.submit_job(**job)
        return RayJobHandle(self.client, job_id, run_dir)

    def adopt(self, pid: int | None, job_id: str | None, run_dir: str) -> Handle | None:
        if job_id is None:
            return None
        try:
            self.client.get_job_status(job_id)
        except Exception:
            return None
        return RayJobHandle(self.client, job_id, Path(run_dir))
