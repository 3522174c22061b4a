"""The shared SWE-smith mirror cache is built once, safely, by racing threads and processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, fixture_mirrors
from thundersync.sandbox.envs.swesmith import git, load_instances

REPO = Path(__file__).resolve().parents[2]


def _assert_complete(out: Path) -> None:
    assert (out / ".complete").exists()
    for inst in load_instances(SWESMITH_INSTANCES):
        branches = git(out / inst.repo_name, "branch", "--format=%(refname:short)").split()
        assert inst.instance_id in branches
    leftovers = [p.name for p in out.parent.iterdir() if p != out]
    assert leftovers == [], leftovers  # every loser discarded its temporary copy


def test_racing_threads_all_get_the_same_complete_mirrors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSRL_CACHE", str(tmp_path / "fresh" / "cache"))  # not there yet
    n = 6
    barrier = threading.Barrier(n, timeout=60)

    def race() -> Path:
        barrier.wait()
        return fixture_mirrors()

    with ThreadPoolExecutor(n) as ex:
        outs = [f.result() for f in [ex.submit(race) for _ in range(n)]]
    assert len(set(outs)) == 1
    _assert_complete(outs[0])
    assert fixture_mirrors() == outs[0]  # later calls reuse the cache


def test_racing_processes_all_get_the_same_complete_mirrors(tmp_path: Path) -> None:
    cache = tmp_path / "fresh" / "cache"
    code = (
        "import threading, sys\n"
        "from sandbox.envs.fixtures import fixture_mirrors\n"
        "out = []\n"
        "ts = [threading.Thread(target=lambda: out.append(fixture_mirrors())) for _ in range(3)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "assert len(out) == 3 and len(set(out)) == 1, out\n"
        "print(out[0])\n"
    )
    env = {"TSRL_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-2000:]
    outs = {Path(out.strip()) for out, _ in results}
    assert len(outs) == 1
    _assert_complete(outs.pop())
