"""Where drivers run. The embedded backend spawns a subprocess per run (its own session, so a
signal to the service's terminal does not reach it); an adopted driver (left running by a previous
service process) is watched by pid. The Ray backend is in ray_backend.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Protocol

from thundersync.rundir import RunFiles

# Variables that may carry secrets of the service: drivers never see them.
SECRET_ENV = ("TSRL_ADMIN_TOKEN", "TSRL_ADMIN_TOKEN_FILE", "TSRL_DATABASE_URL")


class Handle(Protocol):
    """A started driver."""

    adopted: bool

    def poll(self) -> int | None:
        """None while running; the exit code after (None-like unknown codes are -255)."""
        ...

    def kill(self) -> None: ...

    def describe(self) -> tuple[int | None, str | None]:
        """(pid, job id) to store on the run."""
        ...


EXIT_UNKNOWN = -255


def driver_env(run_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    env["TSRL_RUN_ID"] = run_id
    return env


class PopenHandle:
    adopted = False

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def describe(self) -> tuple[int | None, str | None]:
        return self.proc.pid, None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class PidHandle:
    """A driver started by an earlier service process: alive while its pid runs our run dir."""

    adopted = True

    def __init__(self, pid: int, run_dir: str) -> None:
        self.pid = pid
        self.run_dir = run_dir

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        stat = Path(f"/proc/{self.pid}/stat")
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except (OSError, IndexError):
            pass
        return self.run_dir in _cmdline(self.pid)

    def poll(self) -> int | None:
        return None if self.alive() else EXIT_UNKNOWN

    def kill(self) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)

    def describe(self) -> tuple[int | None, str | None]:
        return self.pid, None


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, driver_command: list[str]) -> None:
        self.driver_command = driver_command

    def start(self, run_id: str, config_path: Path, run_dir: Path) -> Handle:
        cmd = [*self.driver_command, str(config_path), "--run-dir", str(run_dir)]
        out = RunFiles(run_dir).output_log.open("ab")
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=run_dir,
                env=driver_env(run_id),
                start_new_session=True,
            )
        finally:
            out.close()
        return PopenHandle(proc)

    def adopt(self, pid: int | None, job_id: str | None, run_dir: str) -> Handle | None:
        if pid is None:
            return None
        handle = PidHandle(pid, run_dir)
        return handle if handle.alive() else None
