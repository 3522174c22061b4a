"""cgroup-v1 limits for one sandboxed exec (memory, pids, cpu), used where the host has them.

These machines run cgroup v1 with memory, pids and cpu controllers writable by root. Each exec
gets its own leaf under `<controller>/thundersync/<id>`: limits are set before the command starts
(the launcher shell moves itself in, then execs the sandbox), the OOM-kill counter tells whether
the kernel killed something, and `kill_all` sweeps every process left in the leaf - the backstop
for anything that escaped the process group. On a host without writable v1 controllers (cgroup
v2-only, unprivileged runs) `CgroupLeaf.create` returns None and rlimits are the only limits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")


def available() -> bool:
    """True when every v1 controller we use is mounted and writable (root on a v1 host)."""
    return all(os.access(ROOT / c, os.W_OK) and (ROOT / c / "tasks").exists() for c in CONTROLLERS)


class CgroupLeaf:
    def __init__(self, name: str) -> None:
        self.dirs = {c: ROOT / c / "thundersync" / name for c in CONTROLLERS}

    @classmethod
    def create(cls, name: str, memory_mb: int, pids: int, cpus: float) -> CgroupLeaf | None:
        if not available():
            return None
        leaf = cls(name)
        try:
            for d in leaf.dirs.values():
                d.mkdir(parents=True, exist_ok=True)
            mem = leaf.dirs["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
            with contextlib.suppress(OSError):  # absent without swap accounting
                (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
            (leaf.dirs["pids"] / "pids.max").write_text(str(pids))
            cpu = leaf.dirs["cpu"]
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * 100000))))
        except OSError:
            leaf.destroy()
            return None
        return leaf

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def oom_kills(self) -> int:
        try:
            for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(out)

    def kill_all(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def destroy(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(20):
                try:
                    if d.exists():
                        d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
