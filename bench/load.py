"""A fixed background CPU load for the benchmarks (`tsrl bench speedup --load CORES`).

`CORES` cores' worth of busy work: ceil(CORES) child processes, each spinning for its share of
every 10 ms period and sleeping for the rest (CORES = 1.5 -> two processes at 75 %). They are
not pinned, so they compete with the rollout core and the learner core alike, the way other work
on the machine does. Each child is started and stopped by its own handle (never by name) and also
exits by itself when its parent dies (it watches its parent's pid).

`cores_obtained` is what the load really got (its CPU seconds over the block's wall time, read
from /proc before it stops): on 2 cores a 1-core load gets about a core next to one busy process
(sync) but only about two thirds of one next to two (stream; the OPD bench measured 0.98 and
0.66), and that share is what the stream's two processes lose. The bench reports it per
schedule so a loaded efficiency can be read against the cores the schedule was left with.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

PERIOD_S = 0.01
_CHILD = """
import os, sys, time
duty, period, parent = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
x = 0
while os.getppid() == parent:
    t = time.perf_counter()
    while time.perf_counter() - t < duty * period:
        x = (x * 1103515245 + 12345) % 2147483648
    if duty < 1.0:
        time.sleep((1.0 - duty) * period)
"""


def shares(cores: float) -> list[float]:
    """Duty cycle of each background process for `cores` cores of load."""
    if cores < 0:
        raise ValueError(f"--load {cores}: use a number of cores >= 0 (0 disables the load)")
    n = math.ceil(cores)
    return [cores / n] * n if n else []


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (None where /proc is not there)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class BackgroundLoad:
    """Context manager: the load runs inside the `with` block."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.duties = shares(cores)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0.0
        # CPU seconds and wall seconds of the last `with` block (None: no /proc, or no load)
        self.cpu_s: float | None = None
        self.wall_s = 0.0

    def __enter__(self) -> BackgroundLoad:
        self.started = time.perf_counter()
        for d in self.duties:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, f"{d:.6f}", str(PERIOD_S), str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                )
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.procs:
            used = [cpu_seconds(p.pid) for p in self.procs]
            self.cpu_s = None if None in used else sum(u for u in used if u is not None)
            self.wall_s = time.perf_counter() - self.started
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs = []

    @property
    def cores_obtained(self) -> float | None:
        """Cores' worth of CPU the load got in the last block (<= `cores`; less when the
        machine's other work outcompeted it)."""
        if self.cpu_s is None or self.wall_s <= 0:
            return None
        return self.cpu_s / self.wall_s

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
