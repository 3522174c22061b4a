"""The sandbox pool: warm reuse, reset between uses, the concurrency bound, exit and crash cleanup.

Real backends only: bubblewrap for `local`, podman's Docker-compatible socket for `docker`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from thundersync.sandbox.executor import SessionSpec
from thundersync.sandbox.local import LocalExecutor
from thundersync.sandbox.orphans import cleanup_orphans
from thundersync.sandbox.pool import PoolExhausted, SandboxPool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def base() -> Iterator[Path]:
    # the sandbox user (65534) must traverse every parent: not under pytest's 0700 tmp_path
    d = Path(tempfile.mkdtemp(prefix="tsrl-pooltest-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def spec(tmp_path: Path) -> SessionSpec:
    work = tmp_path / "task"
    work.mkdir()
    (work / "orig.txt").write_text("original\n")
    return SessionSpec(workdir=work, label="pooltest")


def _pool(base: Path, **kw: object) -> SandboxPool:
    return SandboxPool(LocalExecutor(base_dir=base), **kw)  # type: ignore[arg-type]


def test_prewarmed_session_is_reused_and_reset_between_uses(base: Path, spec: SessionSpec) -> None:
    with _pool(base, max_sessions=2) as pool:
        assert pool.prewarm(spec, 1) == 1 and pool.open_count == 1
        warm = pool._idle[next(iter(pool._idle))][0]
        with pool.acquire(spec) as s:
            assert s.session is warm  # the warm one, not a new one
            r = s.exec("echo dirty > new.txt; echo changed > orig.txt; cat orig.txt")
            assert r.stdout == "changed\n"
        assert pool.idle_count(spec) == 1 and pool.leased_count == 0
        with pool.acquire(spec) as s:
            assert s.session is warm
            r = s.exec("ls; cat orig.txt")
            assert r.stdout.split() == ["orig.txt", "original"]  # new.txt gone, orig restored
        assert pool.stats["opened"] == 1 and pool.stats["reused"] == 2
        root = warm.root
        assert root.exists()
    assert not root.exists() and pool.open_count == 0  # closed on exit


def test_other_spec_gets_its_own_session_and_close_returns_the_lease(
    base: Path, spec: SessionSpec
) -> None:
    with _pool(base, max_sessions=1) as pool:
        a = pool.acquire(spec)
        first = a.session
        a.close()  # an env closing its session hands it back to the pool
        other = SessionSpec(label="other")
        with pool.acquire(other) as b:  # the bound is 1: the idle `spec` session is evicted
            assert b.session is not first and pool.open_count == 1
            assert b.exec("ls").stdout == ""
        assert not first.root.exists()
        with pytest.raises(Exception, match="released"):
            a.exec("true")


def test_acquire_beyond_the_bound_waits_for_a_release(base: Path, spec: SessionSpec) -> None:
    with _pool(base, max_sessions=2) as pool:
        held = [pool.acquire(spec), pool.acquire(spec)]
        got = threading.Event()
        leases = []

        def third() -> None:
            leases.append(pool.acquire(spec, timeout=120))
            got.set()

        t = threading.Thread(target=third, daemon=True)
        t.start()
        assert not got.wait(0.5)  # N+1-th acquire waits while N are leased
        assert pool.leased_count == 2
        first = held[0].session
        held[0].release()
        assert got.wait(120)  # ... and gets the released (reset) session
        t.join(10)
        assert leases[0].session is first
        with pytest.raises(PoolExhausted, match=r"max_sessions=\.\.\.\) \(now 2\)"):
            pool.acquire(spec, timeout=0.2)
        for lease in [held[1], leases[0]]:
            lease.release()
        assert pool.leased_count == 0 and pool.open_count == 2


def test_failed_reset_discards_the_session(base: Path, spec: SessionSpec) -> None:
    with _pool(base, max_sessions=1) as pool:
        with pool.acquire(spec) as s:
            broken = s.session
            broken.reset = lambda: (_ for _ in ()).throw(OSError("disk gone"))
        assert pool.stats["reset_failed"] == 1 and pool.open_count == 0
        with pool.acquire(spec) as s:
            assert s.session is not broken


CRASHER = textwrap.dedent(
    """
    import os, sys, time
    from thundersync.sandbox.executor import SessionSpec
    from thundersync.sandbox.pool import SandboxPool
    backend = sys.argv[1]
    if backend == "local":
        from thundersync.sandbox.local import LocalExecutor
        pool = SandboxPool(LocalExecutor(base_dir=sys.argv[2]), max_sessions=3)
    else:
        pool = SandboxPool("docker", max_sessions=3)
    leases = [pool.acquire(SessionSpec(label="crash")) for _ in range(2)]
    pool.prewarm(SessionSpec(label="crash-idle"), 1)
    ids = [getattr(s.session, "root", None) or s.session.container.id for s in leases]
    print("READY", os.getpid(), *ids, flush=True)
    if sys.argv[-1] == "exit":
        sys.exit(0)  # a normal exit without pool.close(): atexit closes the sessions
    time.sleep(600)
    """
)


def _crash(backend: str, *args: str) -> list[str]:
    """Run CRASHER, wait until it opened its sessions, SIGKILL it; the ids it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, backend, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert line[:2] == ["READY", str(proc.pid)], line
    return line[2:]


def test_a_pool_left_open_is_closed_at_interpreter_exit(base: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CRASHER, "local", str(base), "exit"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split()[0] == "READY", out.stderr[-2000:]
    assert list(base.iterdir()) == []  # no pool.close() in the script: the atexit hook ran


def test_cleanup_orphans_removes_a_sigkilled_owners_local_sessions(
    base: Path, spec: SessionSpec
) -> None:
    roots = [Path(p) for p in _crash("local", str(base))]
    left = [d for d in base.iterdir()]
    assert len(left) == 3 and all(r in left for r in roots)  # 2 leased + 1 idle, no atexit ran
    owner = json.loads((roots[0] / "owner.json").read_text())
    assert owner["pid"] > 0
    with LocalExecutor(base_dir=base).open(spec) as mine:  # a live owner's session stays
        counts = cleanup_orphans(base_dir=base, docker=False)
        assert counts == {"local": 3, "docker": 0}
        assert list(base.iterdir()) == [mine.root]


def test_a_new_pool_cleans_up_after_a_crashed_one(base: Path, spec: SessionSpec) -> None:
    _crash("local", str(base))
    assert len(list(base.iterdir())) == 3
    with _pool(base) as pool:
        assert list(base.iterdir()) == []
        with pool.acquire(spec) as s:
            assert s.exec("cat orig.txt").stdout == "original\n"


def test_docker_pool_resets_and_cleans_up_a_crashed_owners_containers(
    spec: SessionSpec,
) -> None:
    from thundersync.sandbox.docker_backend import LABEL, DockerExecutor

    ex = DockerExecutor()
    with SandboxPool(ex, max_sessions=1) as pool:
        with pool.acquire(spec) as s:
            s.exec("echo x > new.txt; echo y > /tmp/junk; (setsid sleep 31337 &) ; true")
            cid = s.session.container.id
        with pool.acquire(spec) as s:
            assert s.session.container.id == cid  # warm reuse of the same container
            r = s.exec("ls; ls /tmp; ls /proc | grep -c '^[0-9]'; cat orig.txt")
            lines = r.stdout.split()
            assert lines[0] == "orig.txt" and "junk" not in lines and lines[-1] == "original"
            assert int(lines[-2]) <= 7  # init, sleep, this exec's 5: the setsid sleep is gone
    ids = _crash("docker")
    alive = {c.id for c in ex.client.containers.list(all=True, filters={"label": f"{LABEL}=1"})}
    assert set(ids) <= alive
    counts = cleanup_orphans(local=False, docker_client=ex.client)
    assert counts["docker"] >= 3  # 2 leased + 1 idle
    alive = {c.id for c in ex.client.containers.list(all=True, filters={"label": f"{LABEL}=1"})}
    assert not set(ids) & alive and cid not in alive
