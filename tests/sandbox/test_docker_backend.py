"""The docker backend, for real, through podman's Docker-compatible socket (started if needed)."""

from __future__ import annotations

import time

import pytest

from thundersync.sandbox.docker_backend import DockerExecutor
from thundersync.sandbox.executor import SandboxError, SessionSpec
from thundersync.sandbox.selftest import ATTACKS, probe, run_selftest


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


def test_docker_selftest_contains_every_attack(docker_executor: DockerExecutor) -> None:
    report = run_selftest(docker_executor)
    bad = [d for d in report["details"] if not d["contained"]]  # type: ignore[attr-defined]
    assert report["attacks"] == len(ATTACKS) and not bad, bad


def test_fork_bomb_is_contained_and_the_session_stays_usable(
    docker_executor: DockerExecutor,
) -> None:
    with docker_executor.open(SessionSpec(label="bomb")) as s:
        s.put_file("keep.txt", b"kept")
        r = s.exec("b(){ b|b & }; b; sleep 3", timeout=6)
        assert not r.ok or r.exit_code == 0  # data, not an exception
        for _ in range(3):  # pid 1 reaps; the wrapper killed every leftover
            after = probe(s, "echo alive; ls /proc | grep -c '^[0-9]'")
            # [:1], not [0]: an empty stdout must fail with the whole result (exit code,
            # stderr, duration) in the message, not with an IndexError that hides it
            assert after.stdout.split()[:1] == ["alive"], after
        # only pid 1 (init), `sleep infinity` and this exec's own 5 (sh, timeout, bash, ls, grep)
        count = after.stdout.split()[1:]
        assert len(count) == 1 and int(count[0]) <= 7, after
        assert s.get_file("keep.txt") == b"kept"


def test_wedged_container_recovers_by_restart_keeping_files(
    docker_executor: DockerExecutor,
) -> None:
    with docker_executor.open(SessionSpec(label="wedged")) as s:
        s.put_file("keep.txt", b"kept")
        # a root-owned bomb: the uid-65534 kill cannot touch it, so only a restart helps
        api = s.client.api
        eid = api.exec_create(s.container.id, ["bash", "-c", "b(){ b|b & }; b"], user="0")
        api.exec_start(eid, detach=True)
        time.sleep(1)  # let it fill the pids limit
        after = probe(s, "echo alive")
        assert after.stdout.strip() == "alive", after
        assert s.get_file("keep.txt") == b"kept"


def test_file_tools_recover_a_wedged_container_by_themselves(
    docker_executor: DockerExecutor,
) -> None:
    """get_file / put_file straight after a root fork bomb (no exec to recover first)."""
    with docker_executor.open(SessionSpec(label="wedged-files")) as s:
        s.put_file("keep.txt", b"kept")
        api = s.client.api
        eid = api.exec_create(s.container.id, ["bash", "-c", "b(){ b|b & }; b"], user="0")
        api.exec_start(eid, detach=True)
        time.sleep(1)
        assert s.get_file("keep.txt") == b"kept"
        s.put_file("after.txt", b"written")
        assert s.get_file("after.txt") == b"written"


def test_file_tools_act_as_the_agent_user_not_root(docker_executor: DockerExecutor) -> None:
    with docker_executor.open(SessionSpec(label="files")) as s:
        s.put_file("mine.txt", b"\x00bin\xff")
        assert s.exec("stat -c %u mine.txt").stdout.strip() == "65534"
        assert s.get_file("mine.txt") == b"\x00bin\xff"
        with pytest.raises(SandboxError, match="put_file"):
            s.put_file("/etc/tsrl-evil", b"root write")  # root-owned dir: the agent cannot
        assert s.exec("test -e /etc/tsrl-evil || echo absent").stdout.strip() == "absent"
        api = s.client.api  # a root-only file (as the image's /etc/shadow is)
        eid = api.exec_create(
            s.container.id,
            ["sh", "-c", "echo s3cret > /root-only && chmod 600 /root-only"],
            user="0",
        )
        api.exec_start(eid)
        time.sleep(0.5)
        assert s.exec("cat /root-only 2>&1").exit_code != 0
        assert s.get_file("/root-only") is None
        s.exec("mkfifo fifo")
        assert s.get_file("fifo") is None  # no hang on a FIFO
        assert s.exec("ls -A /run/tsrl-stage").stdout == ""  # no staged bytes left behind
