"""Child processes that die with their parent: a driver killed with SIGKILL leaves nothing behind.

Linux's PR_SET_PDEATHSIG makes the kernel send a signal to a process when the thread that created
it exits, whatever killed it; a child calls `die_with_parent()` first thing (the driver starts its
learner processes from its main thread, so "the thread" is the driver's life). Elsewhere it is a
no-op and the parent's own cleanup is all there is.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; True when armed.

    `parent_pid`: the parent this child expects; if it is already gone (it died before the
    signal was armed), exit at once instead of lingering.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # orphaned before the signal was armed
    return True
