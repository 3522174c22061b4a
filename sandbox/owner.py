"""Who owns a sandbox: the pid, host and start time of the process that opened it.

Local session directories carry an `owner.json`, containers carry `thundersync.owner_*` labels.
`sandbox.orphans.cleanup_orphans()` removes what belongs to owners that are dead: the pid is
gone, or it is now another process (a different start time - pids are reused). Leftovers from
another host, or without owner data, are never touched.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

OWNER_FILE = "owner.json"


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    start: float  # process create time, unix seconds

    def alive(self) -> bool:
        """True unless this owner is known to be dead (other hosts count as alive)."""
        if self.host != socket.gethostname():
            return True
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return abs(proc.create_time() - self.start) < 1.0
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False
        except psutil.Error:
            return True

    def write(self, directory: Path) -> None:
        (directory / OWNER_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, directory: Path) -> Owner | None:
        try:
            d = json.loads((directory / OWNER_FILE).read_text())
            return cls(int(d["pid"]), str(d["host"]), float(d["start"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> Owner | None:
        try:
            return cls(
                int(labels["thundersync.owner_pid"]),
                labels["thundersync.owner_host"],
                float(labels["thundersync.owner_start"]),
            )
        except (KeyError, ValueError):
            return None


_CURRENT: Owner | None = None


def current_owner() -> Owner:
    global _CURRENT
    pid = os.getpid()
    if _CURRENT is None or _CURRENT.pid != pid:  # recomputed after a fork
        _CURRENT = Owner(pid, socket.gethostname(), psutil.Process(pid).create_time())
    return _CURRENT
