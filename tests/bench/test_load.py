"""`bench.load`: the fixed background CPU load of `tsrl bench speedup --load`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.load import BackgroundLoad, shares


def test_shares() -> None:
    assert shares(0) == []
    assert shares(1.0) == [1.0]
    assert shares(1.5) == [0.75, 0.75]
    with pytest.raises(ValueError, match="cores >= 0"):
        shares(-1)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_background_load_burns_cpu_and_stops() -> None:
    with BackgroundLoad(0.5) as load:
        assert len(load.pids) == 1
        procs = list(load.procs)
        time.sleep(0.8)
        assert _cpu_s(load.pids[0]) >= 0.05
    assert load.pids == []
    assert all(p.poll() is not None for p in procs)
