"""The docker backend, for real, through podman's Docker-compatible socket (started if needed)."""

from __future__ import annotations

import pytest

from sandbox.docker_backend import DockerExecutor
from sandbox.executor import SessionSpec
from sandbox.selftest import ATTACKS, run_selftest


@pytest.fixture(scope="module")
def docker_executor() -> DockerExecutor:
    return DockerExecutor()


def test_exec_files_and_timeout_in_a_container(docker_executor: DockerExecutor) -> None:
    with docker_executor.open(SessionSpec(scratch=("/tests",))) as s:
        r = s.exec("id -u; pwd; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout.split(), r.stderr) == (3, ["65534", "/task"], "err\n")
        s.put_file("a/b.txt", b"hey")
        assert s.get_file("a/b.txt") == b"hey" and s.get_file("nope") is None
        t = s.exec("sleep 100", timeout=2)
        assert t.timed_out


def test_docker_selftest_contains_attacks(docker_executor: DockerExecutor) -> None:
    names = [n for n in ATTACKS if n != "fork_bomb"]
    report = run_selftest(docker_executor, names)
    bad = [d for d in report["details"] if not d["contained"]]  # type: ignore[attr-defined]
    assert report["attacks"] == len(names) and not bad, bad


@pytest.mark.xfail(
    reason="known gap: a fork bomb leaves the container's pids exhausted, next exec fails"
)
def test_docker_fork_bomb_leaves_session_usable(docker_executor: DockerExecutor) -> None:
    report = run_selftest(docker_executor, ["fork_bomb"])
    assert report["contained"] == 1
