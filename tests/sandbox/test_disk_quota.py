"""Disk and inode quotas and bounded file reads, on both real backends (bubblewrap; podman's
Docker-compatible socket): a fill past the limit is an ENOSPC observation, never a full host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from thundersync.sandbox.executor import Executor, Limits, SandboxError, Session, SessionSpec
from thundersync.sandbox.local import LocalExecutor

REPO = Path(__file__).resolve().parents[2]
FILL_2GB = "for i in 1 2 3 4; do dd if=/dev/zero of=$D/f$i bs=1M count=500 status=none; done"
FILL_200K_INODES = "python3 -c \"for i in range(200000): open(f'$D/i{i}', 'w').close()\""


@pytest.fixture(scope="module", params=["local", "docker"])
def executor(request: pytest.FixtureRequest) -> Executor:
    if request.param == "local":
        return LocalExecutor()
    from thundersync.sandbox.docker_backend import DockerExecutor

    return DockerExecutor()


@pytest.fixture
def session(executor: Executor) -> Iterator[Session]:
    s = executor.open(SessionSpec(label="quota", scratch=("/logs/verifier",)))
    yield s
    s.close()


def _used(s: Session, flag: str) -> int:
    """Blocks (1K) or inodes used on the session's task filesystem."""
    r = s.exec(f"df -P {flag} /task | tail -1")
    return int(r.stdout.split()[2])


@pytest.mark.parametrize("where", ["/task", "/tmp", "/logs/verifier"])
def test_a_2gb_fill_stops_at_the_disk_limit_with_enospc(session: Session, where: str) -> None:
    limit_kb = Limits().disk_mb * 1024
    r = session.exec(FILL_2GB.replace("$D", where), timeout=120)
    assert "No space left on device" in r.combined() and not r.oom_killed, r
    assert limit_kb * 0.9 < _used(session, "-k") <= limit_kb  # all that was written, no more
    assert session.exec("echo still here").stdout == "still here\n"  # the sandbox lives on
    session.reset()  # a reset gives the space back
    assert _used(session, "-k") < 1024 and session.exec("ls -A /tmp /task").stdout.split() == [
        "/task:",
        "/tmp:",
    ]


def test_200k_inodes_stop_at_the_inode_limit_with_enospc(session: Session) -> None:
    r = session.exec(FILL_200K_INODES.replace("$D", "/tmp"), timeout=120)
    assert "No space left on device" in r.combined(), r
    used = _used(session, "-i")
    assert Limits().inodes * 0.99 < used <= Limits().inodes + 1024, used


def test_get_file_refuses_special_files_quickly(session: Session) -> None:
    session.exec("ln -s /dev/zero z; mkfifo fifo; ln -s /proc/self/environ pe; echo hi > a")
    session.exec("ln -s a l; ln -s /etc/hostname h; head -c 300000000 /dev/zero > big")
    for path in ["z", "fifo", "pe", "/proc/self/status", "/dev/urandom", "big", "nope"]:
        t = time.monotonic()
        assert session.get_file(path) is None, path
        assert time.monotonic() - t < 5, path
    assert session.get_file("l") == b"hi\n" == session.get_file("/task/a")
    assert (session.get_file("h") or b"").strip() == b"sandbox"  # resolved inside, not on the host


def test_a_host_that_cannot_enforce_the_limits_refuses_naming_them() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="tsrl-quota-"))
    os.chmod(tmp_path, 0o777)  # an unprivileged local executor: no loop mount for it
    code = (
        "from thundersync.sandbox.local import LocalExecutor\n"
        "from thundersync.sandbox.executor import Limits, SessionSpec\n"
        f"ex = LocalExecutor(base_dir={str(tmp_path / 'b')!r})\n"
        "try:\n    ex.open(SessionSpec())\nexcept Exception as e:\n    print('REFUSED', e)\n"
        "s = ex.open(SessionSpec(limits=Limits(disk_mb=0, inodes=0)))\n"
        "print('OPT-OUT', s.exec('echo ok').stdout.strip())\ns.close()\n"
    )
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run(
        [*setpriv, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert "REFUSED local sandbox: Limits.disk_mb=1024 and Limits.inodes=100000" in out.stdout, (
        out.stdout + out.stderr
    )
    shutil.rmtree(tmp_path)
    assert "needs root" in out.stdout and "OPT-OUT ok" in out.stdout


def test_a_remote_docker_engine_refuses_the_disk_limit() -> None:
    from thundersync.sandbox.docker_backend import DockerExecutor

    ex = DockerExecutor()
    ex.local_engine = False  # as with DOCKER_HOST=tcp://...: no host path reaches the engine
    with pytest.raises(SandboxError, match=r"Limits.disk_mb=1024 cannot be enforced"):
        ex.open(SessionSpec())


def test_the_limits_are_per_session_settings(executor: Executor) -> None:
    s = executor.open(SessionSpec(limits=Limits(disk_mb=64, inodes=2000)))
    try:
        r = s.exec("dd if=/dev/zero of=f bs=1M count=100 status=none; df -Pk . | tail -1")
        assert "No space left on device" in r.stderr and int(r.stdout.split()[1]) <= 64 * 1024
        r = s.exec("rm f; for i in $(seq 3000); do : > i$i || break; done; ls | wc -l")
        assert "No space left on device" in r.stderr and 1900 < int(r.stdout) <= 2000, r
    finally:
        s.close()


def test_a_root_docker_session_is_refused_unless_its_unbounded_image_layer_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root and image-user sessions write the image's own layer, which podman's overlay on ext4
    cannot cap: refused naming the limit, unless the session or the host accepts it."""
    from thundersync.sandbox.docker_backend import DockerExecutor

    monkeypatch.setenv("TSRL_SANDBOX_UNBOUNDED_LAYER", "0")
    ex = DockerExecutor()
    for user in ("root", "1000:1000"):
        with pytest.raises(
            SandboxError, match=r"Limits.disk_mb=1024 cannot be enforced.*unbounded"
        ):
            ex.open(SessionSpec(exec_user=user))
    s = ex.open(SessionSpec(exec_user="root", limits=Limits(unbounded_layer=True)))
    try:  # the quota still holds where it can: the task dir
        r = s.exec(f"D=.; {FILL_2GB}; whoami")
        assert "No space left on device" in r.stderr and r.stdout.strip() == "root", r
    finally:
        s.close()
    s = ex.open(SessionSpec())  # the sandbox user writes only the quota'd dirs: no refusal
    s.close()
    monkeypatch.setenv("TSRL_SANDBOX_UNBOUNDED_LAYER", "yes")
    with pytest.raises(SandboxError, match="TSRL_SANDBOX_UNBOUNDED_LAYER must be 0 or 1"):
        ex.open(SessionSpec(exec_user="root"))


def test_the_hosts_layer_declaration_is_its_set_up_file_unless_the_variable_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from thundersync.sandbox import docker_backend

    decl = tmp_path / "unbounded-image-layer"
    monkeypatch.setattr(docker_backend, "LAYER_DECLARATION", decl)
    monkeypatch.delenv("TSRL_SANDBOX_UNBOUNDED_LAYER", raising=False)
    assert not docker_backend.unbounded_layer_ok()  # no declaration: refused
    decl.write_text("declared\n")
    assert docker_backend.unbounded_layer_ok()
    monkeypatch.setenv("TSRL_SANDBOX_UNBOUNDED_LAYER", "0")  # the variable wins either way
    assert not docker_backend.unbounded_layer_ok()
    decl.unlink()
    monkeypatch.setenv("TSRL_SANDBOX_UNBOUNDED_LAYER", "1")
    assert docker_backend.unbounded_layer_ok()
