"""The executor seam: one small Protocol that every sandbox backend implements.

Rollout workers and environments only ever see `Executor` / `Session` and the typed `ExecResult`,
so the local bubblewrap backend (laptops, CI without Docker) and the docker backend (clusters;
podman's Docker-compatible socket here) are interchangeable. A failing or hostile command comes
back as data (exit code, timed_out, oom_killed, truncated output); only a broken sandbox (missing
binary, daemon down) raises `SandboxError`. `sandbox.backends.get_executor` picks a backend by
name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class Backend(StrEnum):
    LOCAL = "local"
    DOCKER = "docker"


class SandboxError(RuntimeError):
    """The sandbox itself is broken (not the command run inside it)."""


class ExecOutputLost(SandboxError):
    """A read (`get_file`) whose bytes the engine lost on every try. Commands are never retried
    (they may have had effects): their result says `output_lost` instead."""


@dataclass(frozen=True)
class Limits:
    """Per-session resource limits (applied per exec where the backend works per process)."""

    memory_mb: int = 1024
    pids: int = 256
    cpus: float = 1.0
    cpu_seconds: int = 600
    file_size_mb: int = 512
    open_files: int = 1024
    output_bytes: int = 256 * 1024  # per stream; head half + tail half are kept
    # the session's writable dirs (task, scratch, /tmp) sit on a filesystem of this size and
    # inode count (`sandbox.quota`); 0 = none (a host that cannot enforce them refuses others)
    disk_mb: int = 1024
    inodes: int = 100_000
    # docker sessions as root or as the image's user also write the image's own layer, which
    # podman's overlay on ext4 cannot cap: with disk_mb > 0 such a session is refused unless this
    # accepts an unbounded layer (task, scratch and temp dirs keep their quota); the host-wide
    # switch is TSRL_SANDBOX_UNBOUNDED_LAYER=1 or the sandbox set-up's declaration file
    unbounded_layer: bool = False


@dataclass(frozen=True)
class SessionSpec:
    """What a session is opened for.

    `workdir` is the host directory whose contents become the writable task directory (copied in
    for docker, bind-mounted for local). `mount_at` is its path inside the sandbox.
    """

    workdir: Path | None = None
    mount_at: str = "/task"
    image: str | None = None
    network: bool = False
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    label: str = "task"
    # extra absolute directories that must exist, writable and persistent for the session
    # (e.g. "/tests", "/logs/verifier" for Terminal-Bench verifiers)
    scratch: tuple[str, ...] = ()
    # who runs `exec` and the file tools: None = the unprivileged sandbox user (uid 65534);
    # "root" = uid 0 in the container on the docker backend (verifiers); another name or
    # uid[:gid] = that user of the image (a task Dockerfile's USER: the agent runs as the task's
    # user, never as root). Root and image users get a new container on reset instead of a
    # reused one. The local backend ignores it (bubblewrap has no root: uid 65534).
    exec_user: str | None = None


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    # the engine lost the output (podman #21741): the command ran, stdout/stderr are incomplete
    output_lost: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def combined(self, limit: int = 8000) -> str:
        """stdout + stderr for an agent observation, clipped to `limit` characters."""
        text = self.stdout + (("\n" + self.stderr) if self.stderr else "")
        if self.timed_out:
            text += "\n[timed out]"
        if self.oom_killed:
            text += "\n[killed: out of memory]"
        if self.output_lost:
            text += "\n[output lost by the container engine]"
        if len(text) > limit:
            half = limit // 2
            text = text[:half] + "\n[... output clipped ...]\n" + text[-half:]
        return text


@runtime_checkable
class Session(Protocol):
    """One isolated workspace. Commands run with `mount_at` as the working directory."""

    @property
    def workdir_inside(self) -> str: ...

    def exec(
        self, cmd: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> ExecResult: ...

    def put_file(self, path: str, data: bytes) -> None: ...

    def get_file(self, path: str) -> bytes | None: ...

    def reset(self) -> None:
        """Back to a fresh session: the task dir re-copied, nothing the commands wrote or
        started left (the pool calls this between uses)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Executor(Protocol):
    backend: Backend

    def open(self, spec: SessionSpec) -> Session: ...
