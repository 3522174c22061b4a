"""Crash cleanup: remove the sandbox leftovers (local session directories and their cgroup
leaves, docker containers) of owner processes that are dead.

Every local session directory, docker session's disk-quota directory and docker container names
its owner (pid + start time, see `sandbox.owner`); a `SandboxPool` runs `cleanup_orphans` for
its backend when it starts, so a restarted worker cleans up after the one that was SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from thundersync.sandbox import quota
from thundersync.sandbox.owner import Owner

DEFAULT_SANDBOX_DIR = "/tmp/thundersync-sandbox"


def _session_id(dirname: str) -> str | None:
    parts = dirname.split("-")  # "{label}-{id}-{mkdtemp suffix}"
    return parts[-2] if len(parts) >= 3 else None


def cleanup_orphans(
    base_dir: str | Path | None = None,
    *,
    local: bool = True,
    docker: bool | None = None,
    docker_client: Any = None,
) -> dict[str, int]:
    """Remove sandbox leftovers whose owner process is dead; returns counts per backend.

    local: session directories under `base_dir` (default $TSRL_SANDBOX_DIR or
    /tmp/thundersync-sandbox) whose `owner.json` names a dead process, and the cgroup leaves of
    their execs. docker: containers labelled `thundersync.sandbox=1` whose owner labels name a
    dead process on this host. `docker=None` cleans docker only where an engine answers without
    being started (a given `docker_client`, DOCKER_HOST, or a running socket). Leftovers without
    owner data, of live owners, or of other hosts are never touched.
    """
    counts = {"local": 0, "docker": 0}
    base = Path(base_dir or os.environ.get("TSRL_SANDBOX_DIR", DEFAULT_SANDBOX_DIR))
    if local:
        counts["local"] = _sweep_dirs(base, docker=False)
    if docker is not False:
        client = docker_client or _docker_client(start=bool(docker))
        if client is not None:
            counts["docker"] = _cleanup_containers(client)
            _sweep_dirs(base, docker=True)  # their disk-quota images (`sandbox.quota`)
    return counts


def _sweep_dirs(base: Path, docker: bool) -> int:
    """Remove the session dirs of dead owners under `base`: the local backend's, or (docker)
    the docker backend's disk-quota dirs ("docker-..."); a quota filesystem is unmounted first."""
    n = 0
    if not base.is_dir():
        return 0
    for d in base.iterdir():
        if not d.is_dir() or d.is_symlink() or d.name.startswith("docker-") != docker:
            continue
        owner = Owner.read(d)
        if owner is None or owner.alive():
            continue
        sid = _session_id(d.name)
        if sid and not docker:
            _sweep_cgroup_leaves(sid)
        quota.unmount(d / quota.MOUNT)
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            n += 1
    return n


def _sweep_cgroup_leaves(session_id: str) -> None:
    from thundersync.sandbox import cgroups

    for c in cgroups.CONTROLLERS:
        parent = cgroups.ROOT / c / "thundersync"
        with contextlib.suppress(OSError):
            for leaf in parent.glob(f"{session_id}-*"):
                cgroups.CgroupLeaf(leaf.name).destroy()


def _docker_client(start: bool) -> Any:
    try:
        import docker as docker_sdk

        from thundersync.sandbox.docker_support import PODMAN_SOCKET, _ping, ensure_podman_socket

        if start:
            url = ensure_podman_socket()
        elif os.environ.get("DOCKER_HOST"):
            url = os.environ["DOCKER_HOST"]
        elif os.path.exists("/var/run/docker.sock"):
            url = "unix:///var/run/docker.sock"
        elif _ping(f"unix://{PODMAN_SOCKET}"):
            url = f"unix://{PODMAN_SOCKET}"
        else:
            return None
        return docker_sdk.DockerClient(base_url=url, timeout=60)
    except Exception:
        if start:
            raise
        return None


def _cleanup_containers(client: Any) -> int:
    from thundersync.sandbox.docker_support import LABEL

    n = 0
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        owner = Owner.from_labels(c.labels or {})
        if owner is None or owner.alive():
            continue
        with contextlib.suppress(Exception):
            c.remove(force=True)
            n += 1
    return n
