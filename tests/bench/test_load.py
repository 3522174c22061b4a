"""`bench.load`: the fixed background CPU load of `tsrl bench speedup --load`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from thundersync.bench.load import BackgroundLoad, cpu_seconds, shares


def test_shares() -> None:
    assert shares(0) == []
    assert shares(1.0) == [1.0]
    assert shares(1.5) == [0.75, 0.75]
    with pytest.raises(ValueError, match="cores >= 0"):
        shares(-1)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_background_load_burns_cpu_and_stops() -> None:
    with BackgroundLoad(0.5) as load:
        assert len(load.pids) == 1
        procs = list(load.procs)
        time.sleep(0.8)
        used = cpu_seconds(load.pids[0])
        assert used is not None and used >= 0.05
    assert load.pids == []
    assert all(p.poll() is not None for p in procs)
    # what it got: at most its half core (plus the interpreter's start), and some of it
    assert load.cores_obtained is not None and 0.05 <= load.cores_obtained <= 0.75


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_cpu_seconds_reads_a_live_process_and_none_for_a_gone_one() -> None:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    mine = cpu_seconds(os.getpid())
    assert mine is not None and abs(mine - sum(os.times()[:2])) < 0.05
    assert cpu_seconds(2**22 + 12345) is None  # above the kernel's pid_max: no such process


def test_no_load_reports_no_share() -> None:
    with BackgroundLoad(0) as load:
        pass
    assert load.cores_obtained is None
