"""Helpers of the docker backend: the engine socket, owner labels, container options, tars."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from thundersync.sandbox.executor import SandboxError, SessionSpec

PODMAN_SOCKET = "/run/podman/podman.sock"
UID = 65534
LABEL = "thundersync.sandbox"
# a root verifier's container (TB1 / Harbor run verifiers as root with Docker's default set):
# apt drops to _apt (SETUID / SETGID, setgroups), installers chown / keep modes (FSETID), the
# cleanup kills processes of other uids (KILL); not NET_RAW, MKNOD, SETPCAP, AUDIT_WRITE
VERIFIER_CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETUID",
    "SETGID",
    "SETFCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
]


def ensure_podman_socket(path: str = PODMAN_SOCKET, idle_s: int = 600) -> str:
    """URL of a Docker-compatible socket: DOCKER_HOST, a running podman service, or a new one."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    if os.path.exists("/var/run/docker.sock"):
        return "unix:///var/run/docker.sock"
    url = f"unix://{path}"
    if _ping(url):
        return url
    if not shutil.which("podman"):
        raise SandboxError(
            "no Docker engine and no podman: run `sudo bash scripts/setup.d/20-sandbox.sh` "
            "(installs podman + runc and imports the sandbox image)"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    subprocess.Popen(
        ["podman", "system", "service", f"--time={idle_s}", url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",  # conmon inherits it and drops an "oom" marker there after an OOM kill
    )
    for _ in range(100):
        if _ping(url):
            return url
        time.sleep(0.1)
    raise SandboxError(f"podman system service did not answer on {url} within 10 s")


def _ping(url: str) -> bool:
    import docker

    try:
        docker.DockerClient(base_url=url, timeout=5).ping()
        return True
    except Exception:
        return False


def _tar_of(files: dict[str, tuple[bytes, int]], dirs: list[str], uid: int = UID) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, UID, UID
            tar.addfile(info)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, uid, uid
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def owner_labels() -> dict[str, str]:
    """Labels naming this process as a container's owner (pid + start time: pid reuse safe)."""
    from thundersync.sandbox.owner import current_owner

    o = current_owner()
    return {
        "thundersync.owner_pid": str(o.pid),
        "thundersync.owner_host": o.host,
        "thundersync.owner_start": f"{o.start:.2f}",
    }


def container_kwargs(spec: SessionSpec, binds: dict[str, str] | None = None) -> dict[str, Any]:
    """`containers.run` options of a session's container (see `sandbox.docker_backend`);
    `binds`: host dir -> path inside (the session's disk-quota filesystem)."""
    from docker.types import Mount, Ulimit

    lim = spec.limits
    fsize = lim.file_size_mb << 20
    return {
        "network_mode": None if spec.network else "none",
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        "nano_cpus": int(lim.cpus * 1e9),
        "pids_limit": lim.pids,
        "ulimits": [
            Ulimit(name="nofile", soft=4096, hard=4096),
            Ulimit(name="nproc", soft=4096, hard=4096),
            Ulimit(name="fsize", soft=fsize, hard=fsize),
        ],
        "cap_drop": ["ALL"],
        # for the root execs (set-up; a verifier's `exec_user="root"`); uid 65534 execs get none
        "cap_add": VERIFIER_CAPS
        if spec.exec_user == "root"
        else ["CHOWN", "DAC_OVERRIDE", "FOWNER"],
        "security_opt": ["no-new-privileges"],
        "labels": {LABEL: "1", **owner_labels(), "thundersync.label": spec.label},
        "hostname": "sandbox",
        # the keep-alive (`sleep infinity`, pid 1's child) runs as root whatever the image's USER:
        # an exec's cleanup (`kill -9 -1` as the agent's uid) cannot reach it, so a non-root
        # image's container survives each command; without CAP_KILL nor the uid, the agent
        # cannot signal it either
        "user": "0:0",
        "init": True,  # a reaping pid 1 (zombies of killed processes must not pin pids)
        "shm_size": "64m",  # /dev/shm: a tmpfs, charged to the memory limit
        "mounts": [Mount(inside, host, type="bind") for host, inside in (binds or {}).items()],
    }
