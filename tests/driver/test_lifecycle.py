"""A run's processes and broker keys do not outlive its driver; a resume holds each update once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from thundersync.config import load_run_config
from thundersync.driver.faults import FaultPlan
from thundersync.driver.run import RunDriver, RunFailed
from thundersync.rundir import RunFiles

DRIVER = """
import sys
from thundersync.driver.run import RunDriver
from thundersync.config import load_run_config
cfg = load_run_config("grpo-toy", {"updates": 200, "name": "lifecycle"})
RunDriver(cfg, sys.argv[1], bus_kind=sys.argv[2]).run()
"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("bus", ["process", "redis"])
def test_a_sigkilled_driver_takes_its_learner_with_it(tmp_path: Path, bus: str) -> None:
    drv = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), bus])
    try:
        deadline = time.time() + 120
        while not RunFiles(tmp_path).read_metrics():  # the learner has stepped once
            assert drv.poll() is None and time.time() < deadline, "the driver did not train"
            time.sleep(0.2)
        learners = _children(drv.pid)
        assert len(learners) == 1, learners
        os.kill(drv.pid, signal.SIGKILL)
        drv.wait(10)
        deadline = time.time() + 15
        while _alive(learners[0]):
            assert time.time() < deadline, f"learner {learners[0]} outlived its driver"
            time.sleep(0.1)
        if bus == "redis":  # the streams it could not delete expire instead of staying forever
            client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
            keys = client.keys(f"tsrl:lifecycle-{drv.pid}-*")
            assert keys and all(0 < client.ttl(k) <= 24 * 3600 for k in keys)
            client.delete(*keys)
    finally:
        if drv.poll() is None:
            drv.kill()


def test_resume_after_a_kill_between_publish_and_checkpoint_holds_each_update_once(
    tmp_path: Path,
) -> None:
    cfg = load_run_config(
        "grpo-toy",
        {"updates": 3, "rollout.groups_per_update": 2, "checkpoint_every": 1},
    )
    plan = FaultPlan(kill_learner_at_publish=2)  # v2 served, never checkpointed
    with pytest.raises(RunFailed, match="learner process died"):
        RunDriver(cfg, tmp_path, log_batches=True, faults=plan).run()
    assert RunDriver(cfg, tmp_path, resume=True, log_batches=True).run() == 0
    files = RunFiles(tmp_path)
    assert [m["update"] for m in files.read_metrics()] == [0, 1, 2]
    spans = [json.loads(x) for x in files.spans.read_text().splitlines()]
    work = [(s["update"], s["ids"]["source"]) for s in spans if s["kind"] == "work_item"]
    assert work and len(work) == len(set(work))  # no source of a redone update twice
