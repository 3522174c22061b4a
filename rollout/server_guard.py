"""Servers that die with the process that started them, however it dies (SIGKILL included).

`ServerGuard.wrap(cmd)` gives the argv of a small guard, `python server_guard.py FD -- CMD...`: it
runs CMD in the guard's own process group and watches FD, the read end of a pipe whose write end only
the starter holds (non-inheritable: no other child of the starter gets a copy). When the starter
exits, the kernel closes the write end, the guard reads EOF and ends the whole group (SIGTERM,
then SIGKILL after a grace period). When CMD exits, whatever it left in the group is killed too,
and the guard exits with CMD's code.

Why not PR_SET_PDEATHSIG (`thundersync.lifecycle.die_with_parent`, which the learner processes use): it
fires when the *thread* that forked the child exits. A teacher server is restarted from whichever
rollout thread saw it fail (teacher/supervised.py), and those threads come and go with every
update's event loop: the server would die with the thread, not with the driver. A pipe belongs
to the process. `VLLMServer` (rollout/vllm_server.py) starts every vLLM server, teacher or
rollout inference engine, through this guard (it lives here, beside its only user).

This file runs as a script (no package imports: the server's env has no PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

GRACE_S = 10.0


class ServerGuard:
    """The starter's end: `wrap` the command, pass `pass_fds` to Popen, `started()` after it,
    `close()` once the server is stopped (closing it earlier stops the server)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # both non-inheritable (PEP 446)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,) if self._read >= 0 else ()

    def wrap(self, cmd: Sequence[str]) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), str(self._read), "--", *cmd]

    def started(self) -> None:
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def close(self) -> None:
        self.started()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


def _group_members(pgid: int) -> list[int]:
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(int(entry)) == pgid:
                out.append(int(entry))
    return out


def _signal_group(pgid: int, sig: int) -> None:
    for pid in _group_members(pgid):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _end(child: subprocess.Popen[bytes], pgid: int) -> None:
    """The starter is gone: stop the server and everything it started."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    child.wait()


def guard(fd: int, cmd: list[str]) -> int:
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # a group of our own, so ending it never reaches the starter's
    pgid = os.getpgrp()
    child = subprocess.Popen(cmd)  # fd is not inheritable: the server holds no end of the pipe

    def forward(sig: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 0.5)
        except InterruptedError:
            ready = []
        if child.poll() is not None:
            break
        if ready and not os.read(fd, 1):
            _end(child, pgid)
            break
    _signal_group(pgid, signal.SIGKILL)  # workers the server left behind
    code = child.returncode
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: server_guard.py FD -- CMD [ARGS...]", file=sys.stderr)
        return 2
    return guard(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
