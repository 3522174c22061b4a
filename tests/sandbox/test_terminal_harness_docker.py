"""Terminal tasks on the docker backend as their harnesses run them: a non-root USER image, the
verifier's capabilities, /app exactly as the Dockerfile builds it, the Harbor verifier hacks."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from thundersync.sandbox.docker_backend import DockerExecutor
from thundersync.sandbox.envs.check import check_terminal
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.hacks import run_hack
from thundersync.sandbox.envs.hacks_harbor import HACKS_HARBOR
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.executor import SessionSpec

NONROOT = TERMINAL_DIR / "tb1-nonroot-user"


@pytest.fixture(scope="module")
def docker_executor() -> DockerExecutor:
    return DockerExecutor()


@pytest.fixture
def nonroot_env(docker_executor: DockerExecutor) -> Iterator[TerminalEnv]:
    env = TerminalEnv(extras={"task": str(NONROOT), "executor": docker_executor})
    yield env
    env.close()


def _bash(env: TerminalEnv, cmd: str) -> str:
    out = env.step(f"<tool>bash\n{cmd}</tool>")
    return str(out["observations"][0]["content"])


def test_non_root_user_image_survives_every_command(nonroot_env: TerminalEnv) -> None:
    env = nonroot_env
    env.init()
    assert _bash(env, "whoami").split() == ["worker", "[exit", "code", "0]"]
    assert _bash(env, "sort /home/worker/colors.txt | paste -sd, - > report.txt").endswith(
        "[exit code 0]"
    )
    # the keep-alive is root's: the agent's own `kill -9 -1` (and the cleanup after each of its
    # commands) cannot reach it, so the container and the agent's files survive
    keep = _bash(
        env, "for p in /proc/[0-9]*; do echo $(stat -c %u $p) $(tr '\\0' ' ' < $p/cmdline); done"
    )
    assert any(line.startswith("0 sleep infinity") for line in keep.splitlines()), keep
    _bash(env, "kill -9 -1")
    after = _bash(env, "cat report.txt; stat -c %u report.txt")
    assert after.split()[:2] == ["blue,green,red", "1500"] and after.endswith("[exit code 0]")
    env.step('<tool>create\n{"path": "report.txt", "content": "worker\\nblue,green,red\\n"}</tool>')
    got = env.step("<tool>submit</tool>")
    assert got["reward"] == 1.0, got["metadata"]["verdict"]


def test_non_root_user_gold_and_noop(docker_executor: DockerExecutor) -> None:
    out = check_terminal(NONROOT, docker_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out


def test_verifier_may_drop_to_another_user_the_agent_may_not(
    docker_executor: DockerExecutor,
) -> None:
    drop = "setpriv --reuid 65534 --regid 65534 --clear-groups id -u"  # what apt does for _apt
    with docker_executor.open(SessionSpec(exec_user="root", label="caps-verifier")) as s:
        r = s.exec(drop)
        assert (r.exit_code, r.stdout.strip()) == (0, "65534"), r
    with docker_executor.open(SessionSpec(label="caps-agent")) as s:
        r = s.exec(drop)
        assert r.exit_code != 0 and "65534" not in r.stdout, r


def test_app_is_as_the_dockerfile_builds_it(
    docker_executor: DockerExecutor, tmp_path: Path
) -> None:
    out = check_terminal(TERMINAL_DIR / "tb1-app-not-copied", docker_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out  # app/ held the answer
    task = tmp_path / "built-app"
    shutil.copytree(TERMINAL_DIR / "tb1-app-not-copied", task)
    (task / "Dockerfile").write_text(
        "FROM thundersync-sandbox:bookworm\nWORKDIR /app\nRUN echo from-the-image > made.txt\n"
    )
    env = TerminalEnv(extras={"task": str(task), "executor": docker_executor})
    try:
        env.init()
        seen = _bash(env, "ls -A /app; cat /app/made.txt")
    finally:
        env.close()
    assert seen.split()[:2] == ["made.txt", "from-the-image"], seen  # no totals.json


@pytest.mark.parametrize("hack", HACKS_HARBOR, ids=lambda h: h.name)
def test_harbor_verifier_hacks_earn_zero(docker_executor: DockerExecutor, hack: Any) -> None:
    env = TerminalEnv(extras={"task": str(TERMINAL_DIR / hack.target), "executor": docker_executor})
    try:
        got = run_hack(hack, env)
    finally:
        env.close()
    assert got["reward"] == 0.0 and got["defeated"], got
