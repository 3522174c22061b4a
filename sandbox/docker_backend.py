"""`docker` backend: one container per session through the docker SDK.

In production this talks to Docker; on these machines (no Docker engine) it talks to podman's
Docker-compatible socket (`podman system service`), started on demand by `ensure_podman_socket`
- the same SDK code path. The container runs `sleep infinity` from the task image as root
(whatever the image's USER, so an exec's `kill -9 -1` as the agent's uid cannot stop it) with no
network (unless the task allows it), all capabilities dropped, no-new-privileges,
memory / cpu / pids limits and nofile / nproc / fsize ulimits (podman needs explicit nofile and
nproc ulimits). The task directory is copied in with put_archive. Pid 1 is the engine's init
(`init=True`: docker-init / tini on Docker, catatonit on podman), so killed processes are reaped:
with `sleep` as pid 1 the zombies of a fork bomb kept the pids limit exhausted forever. Execs and
the file tools (`sandbox.docker_exec`) leave no process behind and act as uid 65534, never as
root. Closing removes the container (and everything left in it).

Every container carries the labels `thundersync.sandbox=1`, `thundersync.owner_pid`,
`thundersync.owner_host` and `thundersync.owner_start` (the owner's process start time), so
`sandbox.orphans.cleanup_orphans()` can remove the containers of a crashed owner.

`SessionSpec.exec_user = "root"` (terminal verifiers): `exec` runs as uid 0 with Docker's default
capabilities less NET_RAW / MKNOD / SETPCAP / AUDIT_WRITE (`docker_support.VERIFIER_CAPS`: apt
drops to _apt) and no-new-privileges (other sessions' root set-up execs: CHOWN / DAC_OVERRIDE /
FOWNER); after the command
every process but pid 1 and `sleep infinity` is killed (a root `kill -9 -1` would stop the
container), and `reset` replaces the container (root may have written anywhere), so such a
session is never reused dirty. The file tools still act as uid 65534. `exec_user` naming a user of
the image (a task Dockerfile's non-root USER) runs `exec` and the file tools as that uid:gid
(resolved in the container); such a session is also replaced on reset, since the image's own
files belong to that uid and cannot be told apart from what the agent wrote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from thundersync.sandbox import quota
from thundersync.sandbox.bridge_net import isolate_bridge
from thundersync.sandbox.docker_exec import ContainerExec
from thundersync.sandbox.docker_support import (
    LABEL,
    UID,
    _tar_of,
    container_kwargs,
    ensure_podman_socket,
)
from thundersync.sandbox.executor import Backend, SandboxError, SessionSpec
from thundersync.sandbox.owner import current_owner

DEFAULT_IMAGE = os.environ.get("TSRL_SANDBOX_IMAGE", "thundersync-sandbox:bookworm")
log = logging.getLogger(__name__)
# writable dirs of the image (uid 65534 can write there) that move onto the quota filesystem
_QUOTA_DIRS = {"/tmp": "tmp", "/var/tmp": "vartmp", "/run/lock": "lock"}


# written by scripts/setup.d/20-sandbox.sh where podman's storage cannot cap a container's layer
LAYER_DECLARATION = Path("/etc/thundersync/unbounded-image-layer")


def unbounded_layer_ok() -> bool:
    """The host's declaration that root / image-user sessions may write an unbounded image layer
    (`Limits.unbounded_layer` for every session): TSRL_SANDBOX_UNBOUNDED_LAYER=1 or 0 when set
    (anything else is refused), else whether the sandbox set-up left its declaration file."""
    value = os.environ.get("TSRL_SANDBOX_UNBOUNDED_LAYER")
    if value is None:
        return LAYER_DECLARATION.is_file()
    if value not in ("0", "1"):
        raise SandboxError(f"TSRL_SANDBOX_UNBOUNDED_LAYER must be 0 or 1, got {value!r}")
    return value == "1"


class DockerSession(ContainerExec):
    """One container per session: started, prepared, reset and removed here; its execs and file
    tools are `ContainerExec`'s."""

    def __init__(
        self, client: Any, spec: SessionSpec, image: str, base: Path, local_engine: bool
    ) -> None:
        self.client, self.spec, self.image = client, spec, spec.image or image
        user = spec.exec_user
        if user is not None and (not user or not re.fullmatch(r"[A-Za-z0-9_.:-]+", user)):
            raise SandboxError(
                "SessionSpec.exec_user must be None (the sandbox user), 'root' or a user of the "
                f"image (name or uid[:gid]), got {user!r}"
            )
        self._root = user == "root"
        # an image's own user (a task Dockerfile's USER): its files came with the image, so a
        # reset replaces the container (as for root) instead of deleting what that uid owns
        self._own_user = user is not None and not self._root
        self._user = f"{UID}:{UID}"
        self._keep = ""  # pid of `sleep infinity`: root execs' cleanup must spare it
        self._closed = False
        self._disk = self._quota(base, local_engine)
        try:
            self._start()
        except BaseException:
            self._remove_disk()
            raise
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise

    def _quota(self, base: Path, local_engine: bool) -> quota.DiskImage | None:
        """The session's disk-quota filesystem on the engine's host (bind-mounted into the
        container), or None with `disk_mb=0`; a refusal naming the limit where it cannot be."""
        if not quota.require(self.spec.limits, "docker sandbox"):
            return None
        if not local_engine:
            raise SandboxError(
                f"docker sandbox: Limits.disk_mb={self.spec.limits.disk_mb} cannot be enforced: "
                "the engine is not on this host (its quota filesystem is bind-mounted from here); "
                "give Limits(disk_mb=0, inodes=0) to run without disk and inode limits"
            )
        lim = self.spec.limits
        if (self._root or self._own_user) and not (lim.unbounded_layer or unbounded_layer_ok()):
            raise SandboxError(
                f"docker sandbox {self.spec.label}: Limits.disk_mb={lim.disk_mb} cannot be enforced "
                f"for a session as {self.spec.exec_user!r}: it writes the image's own layer, and "
                "this engine's overlay storage has no per-container size limit; give "
                f"Limits(unbounded_layer=True) (for this host: TSRL_SANDBOX_UNBOUNDED_LAYER=1, or the file "
                f"{LAYER_DECLARATION} that scripts/setup.d/20-sandbox.sh writes) "
                "to accept an unbounded image layer (task, scratch and temp dirs keep the quota), "
                "or Limits(disk_mb=0, inodes=0) to run without disk limits"
            )
        root = Path(tempfile.mkdtemp(prefix=f"docker-{uuid.uuid4().hex[:12]}-", dir=base))
        current_owner().write(root)  # for cleanup_orphans() after a crash of this process
        disk = quota.DiskImage(root, self.spec.limits)
        try:
            disk.fresh()
            for name in _QUOTA_DIRS.values():
                disk.subdir(name, 0o1777)
            for name in self._quota_mounts(disk):
                if not (disk.mnt / name).exists():
                    disk.subdir(name)
        except BaseException:
            disk.remove()
            shutil.rmtree(root, ignore_errors=True)
            raise
        return disk

    def _quota_mounts(self, disk: quota.DiskImage) -> dict[str, str]:
        """Subdir of the quota filesystem -> its path in the container (temp dirs first)."""
        dirs = {v: k for k, v in _QUOTA_DIRS.items()}
        dirs["task"] = self.spec.mount_at
        dirs.update({f"scratch{i}": p for i, p in enumerate(self.spec.scratch)})
        return dirs

    def _remove_disk(self) -> None:
        if self._disk is not None:
            self._disk.remove()
            shutil.rmtree(self._disk.mnt.parent, ignore_errors=True)

    def _start(self) -> None:
        try:
            if self.spec.network:
                isolate_bridge(self.client)  # before the container can send anything
            binds = {}
            if self._disk is not None:
                mounts = self._quota_mounts(self._disk)
                binds = {str(self._disk.mnt / sub): inside for sub, inside in mounts.items()}
            self.container = self.client.containers.run(
                self.image, ["sleep", "infinity"], detach=True, **container_kwargs(self.spec, binds)
            )
        except Exception as e:
            hint = ""
            if "init" in str(e) or "catatonit" in str(e):
                hint = " (podman needs catatonit for init=True: apt-get install catatonit)"
            raise SandboxError(f"could not start a container from {self.image!r}: {e}{hint}") from e
        self._find_main()

    @property
    def workdir_inside(self) -> str:
        return self.spec.mount_at

    def _resolve_user(self, user: str) -> str:
        """`uid:gid` of an image user (a name, uid or uid:gid); root is never an agent's."""
        name, _, group = user.partition(":")
        code, out = self.container.exec_run(["sh", "-c", f'id -u "{name}" && id -g "{name}"'])
        ids = out.decode().split() if code == 0 else []
        if len(ids) != 2 and not name.isdigit():
            raise SandboxError(f"image {self.image!r}: user {user!r} does not exist in it")
        uid = ids[0] if len(ids) == 2 else name
        gid = group or (ids[1] if len(ids) == 2 else uid)
        if uid == "0":
            raise SandboxError(f"image {self.image!r}: user {user!r} is root; agents never are")
        return f"{uid}:{gid}"

    def reset(self) -> None:
        """Back to a fresh session: no process of the sandbox user left, nothing it wrote
        anywhere (task and scratch dirs, /tmp, /var/tmp, /dev/shm, ...), task dir re-copied.
        A root session (`exec_user`) gets a new container: root may have written anywhere."""
        if self._root or self._own_user:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)
            self._start()
        self._prepare()

    def _prepare(self) -> None:
        if self._own_user:
            self._user = self._resolve_user(str(self.spec.exec_user))
        self._kill_leftovers()
        dirs = [self.spec.mount_at, *self.spec.scratch]
        q = " ".join(f"'{d}'" for d in dirs)
        wipe = "" if self._own_user else f"find / /dev/shm -xdev -user {UID} -delete 2>/dev/null; "
        rm = f"rm -rf {q} && "
        if self._disk is not None:  # mount points stay: empty them from the host (no links
            rm = ""  # followed: rmtree works on directory fds)
            for sub in self._quota_mounts(self._disk):
                for p in (self._disk.mnt / sub).iterdir():
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
        self._root_exec(["sh", "-c", f"{wipe}{rm}mkdir -p {q} && chown {self._user} {q}"])
        if self.spec.workdir is not None:
            files: dict[str, tuple[bytes, int]] = {}
            subdirs = []
            root = Path(self.spec.workdir)
            for p in sorted(root.rglob("*")):
                rel = str(p.relative_to(root))
                if p.is_dir() and not p.is_symlink():
                    subdirs.append(rel)
                elif p.is_file() and not p.is_symlink():
                    files[rel] = (p.read_bytes(), p.stat().st_mode & 0o777)
            self.container.put_archive(self.spec.mount_at, _tar_of(files, subdirs))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.container.remove(force=True)
        self._remove_disk()

    def __enter__(self) -> DockerSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DockerExecutor:
    backend = Backend.DOCKER

    def __init__(
        self, base_url: str | None = None, image: str = DEFAULT_IMAGE, base_dir: Path | None = None
    ) -> None:
        import docker

        url = base_url or ensure_podman_socket()
        self.client = docker.DockerClient(base_url=url, timeout=120)
        self.image = image
        # where the sessions' disk-quota images live: on the engine's host, so a unix socket
        self.local_engine = url.startswith("unix://")
        self.base = Path(base_dir or os.environ.get("TSRL_SANDBOX_DIR", "/tmp/thundersync-sandbox"))
        self.base.mkdir(parents=True, exist_ok=True)

    def open(self, spec: SessionSpec) -> DockerSession:
        return DockerSession(self.client, spec, self.image, self.base, self.local_engine)

    def cleanup(self) -> int:
        """Remove every container this backend started, whoever owns it; returns how many.
        (`sandbox.orphans.cleanup_orphans` removes only those of dead owners.)"""
        n = 0
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
            with contextlib.suppress(Exception):
                c.remove(force=True)
                n += 1
        return n
