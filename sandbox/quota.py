"""Disk and inode quotas of a sandbox session: its writable directories on a small filesystem.

Each session gets a sparse ext4 image of `Limits.disk_mb` with `Limits.inodes` inodes,
loop-mounted on the host (nosuid, nodev, discard: deleted files give the host its disk back).
The task directory, the scratch directories and /tmp live on it, so a fill of any of them ends
in ENOSPC ("No space left on device") at the limit: an observation in the command's output, never
a full host disk. The host's own filesystem (ext4 here) has no project quotas and podman's
overlay on ext4 refuses `--storage-opt size`, so a loop-mounted image is the one per-session
limit that works for both backends; it needs root (mount, loop devices) and mkfs.ext4. Where that
is missing, `require` refuses with a message naming the limit (set disk_mb=0 to run without).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from thundersync.sandbox.executor import Limits, SandboxError

IMAGE = "disk.img"
MOUNT = "fs"


def missing() -> str:
    """Why this host cannot enforce disk / inode limits ('' when it can)."""
    if os.geteuid() != 0:
        return "it needs root (a loop-mounted filesystem per session)"
    if not Path("/dev/loop-control").exists():
        return "the host has no loop devices (/dev/loop-control)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            return f"`{tool}` is not installed"
    return ""


def require(limits: Limits, where: str) -> bool:
    """True when `limits` asks for a disk quota and this host can enforce it; False when the
    limits ask for none (disk_mb=0); a refusal naming the limit otherwise."""
    if limits.disk_mb <= 0:
        if limits.inodes > 0:
            raise SandboxError("Limits.inodes needs Limits.disk_mb > 0 (one filesystem holds both)")
        return False
    why = missing()
    if why:
        raise SandboxError(
            f"{where}: Limits.disk_mb={limits.disk_mb} and Limits.inodes={limits.inodes} cannot "
            f"be enforced on this host: {why}; give Limits(disk_mb=0, inodes=0) to run without "
            "disk and inode limits"
        )
    return True


class DiskImage:
    """A sparse ext4 image under `root`, mounted at `root/fs`; `fresh()` replaces it with an
    empty one (a reset), `remove()` unmounts and deletes it."""

    def __init__(self, root: Path, limits: Limits) -> None:
        self.image, self.mnt, self.limits = root / IMAGE, root / MOUNT, limits

    def fresh(self) -> Path:
        self.remove()
        self.mnt.mkdir(mode=0o755, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.limits.disk_mb << 20)
        mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0"]
        if self.limits.inodes > 0:
            mkfs += ["-N", str(self.limits.inodes)]
        for argv in (
            [*mkfs, str(self.image)],
            ["mount", "-o", "loop,nosuid,nodev,discard", str(self.image), str(self.mnt)],
        ):
            r = subprocess.run(argv, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise SandboxError(f"disk quota: `{' '.join(argv)}` failed: {r.stderr.strip()}")
        return self.mnt

    def subdir(self, name: str, mode: int = 0o755) -> Path:
        """A directory on the image (created empty), e.g. the task dir or /tmp (mode 1777)."""
        d = self.mnt / name
        d.mkdir()
        os.chmod(d, mode)
        return d

    def remove(self) -> None:
        unmount(self.mnt)
        self.image.unlink(missing_ok=True)


def unmount(mnt: Path) -> None:
    """Unmount `mnt` if something is mounted there (lazily when busy: a container may still
    hold a bind of it; the loop device goes when the last user does)."""
    if not os.path.ismount(mnt):
        return
    r = subprocess.run(["umount", str(mnt)], capture_output=True, check=False)
    if r.returncode != 0:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
