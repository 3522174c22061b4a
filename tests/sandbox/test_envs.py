"""The envs package: the catalogue, the backend each task carries, and sessions from the pool."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from thundersync.config import EnvName, load_run_config
from thundersync.driver.tasks import task_pool
from thundersync.sandbox.envs import EnvId, base
from thundersync.sandbox.envs.catalogue import CATALOGUE
from thundersync.sandbox.envs.check import check_swe
from thundersync.sandbox.envs.digits_env import DigitsEnv
from thundersync.sandbox.envs.fixtures import SWESMITH_INSTANCES, TERMINAL_DIR
from thundersync.sandbox.envs.swesmith import load_instances
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.executor import ExecResult, SessionSpec
from thundersync.sandbox.local import LocalExecutor
from thundersync.sandbox.pool import SandboxPool


@pytest.fixture
def executor() -> Iterator[LocalExecutor]:
    """A local executor of its own, hence a process-wide pool of its own (closed after)."""
    d = Path(tempfile.mkdtemp(prefix="tsrl-envtest-", dir="/tmp"))  # 65534 must traverse it
    ex = LocalExecutor(base_dir=d)
    yield ex
    base.session_pool(ex).close()
    shutil.rmtree(d, ignore_errors=True)


def test_every_env_name_has_a_catalogue_entry_and_ids_stay_stable() -> None:
    assert set(CATALOGUE) == set(EnvName)
    assert {e.value for e in EnvId} == {
        "tsrl-digits",
        "tsrl-toy-calc",
        "tsrl-swesmith",
        "tsrl-terminal",
    }
    for name, env_id in [("swesmith", EnvId.SWESMITH), ("seta", EnvId.TERMINAL)]:
        refs = task_pool(load_run_config(overrides={"env.name": name}))
        assert refs and {r.env_id for r in refs} == {env_id.value}


def test_toy_tasks_carry_the_configured_backend_and_the_env_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    over = {"env.sandbox": "docker", "rollout.concurrency": 40, "rollout.max_turns": 2}
    cfg = load_run_config("grpo-toy", over)
    refs = task_pool(cfg)
    assert {r.extras["backend"] for r in refs} == {"docker"}
    assert {r.extras["pool_size"] for r in refs} == {40}

    asked: list[tuple[Any, int | None]] = []

    class FakeSession:
        def exec(self, cmd: str, timeout: float = 60.0, env: Any = None) -> ExecResult:
            return ExecResult(0, "ok\n", "")

        def close(self) -> None:
            asked.append(("closed", None))

    class FakePool:
        def acquire(self, spec: SessionSpec) -> FakeSession:
            return FakeSession()

    def fake_pool(backend: Any, size: int | None = None) -> FakePool:
        asked.append((backend, size))
        return FakePool()

    monkeypatch.setattr(base, "session_pool", fake_pool)
    env = DigitsEnv(extras=refs[0].extras)
    env.init()
    assert env.step("12")["observations"][0]["content"] == "tool: ok"
    env.close()
    assert asked == [("docker", 40), ("closed", None)]


def test_terminal_sessions_come_from_the_pool_and_are_reused_fresh(
    executor: LocalExecutor,
) -> None:
    task = str(TERMINAL_DIR / "tb1-hello-file")
    first = TerminalEnv(extras={"task": task, "executor": executor})
    first.init()
    out = first.step("<tool>bash\necho scribble > mine.txt</tool>")
    assert out["metadata"] == {"malformed_tool_call": False}
    bad = first.step("no tool call here")
    assert bad["metadata"]["malformed_tool_call"] and not bad["done"]
    pool = first.pool
    assert pool.leased_count == 1
    first.close()
    assert pool.leased_count == 0 and pool.idle_count() == 1
    second = TerminalEnv(extras={"task": task, "executor": executor})
    second.init()
    assert pool.stats["reused"] == 1 and pool.stats["opened"] == 1
    assert second.session is not None
    assert "mine.txt" not in second.session.exec("ls -A").stdout  # reset in between
    done = second.step("<tool>submit</tool>")
    assert done["done"] and done["reward"] == 0.0 and done["metadata"]["end"] == "submit"
    assert set(done["metadata"]) == {"verdict", "task", "end", "scores"}  # scores: named rewards
    second.close()


def test_swe_env_grades_with_a_one_session_pool(
    executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the agent's session goes back before grading: an env never holds two leases
    monkeypatch.setenv(base.POOL_SIZE_ENV, "1")
    pool = base.session_pool(executor)
    assert pool.max_sessions == 1
    pool.acquire_timeout = 5.0
    res = check_swe(load_instances(SWESMITH_INSTANCES)[0], executor)  # gold, then no-op
    assert (res["gold_reward"], res["noop_reward"]) == (1.0, 0.0), res
    assert pool.leased_count == 0 and pool.open_count <= 1


def test_pools_are_per_backend_and_grow_to_the_requested_size(executor: LocalExecutor) -> None:
    pool = base.session_pool(executor)
    assert pool.max_sessions == base.pool_size() >= 1
    assert base.session_pool(executor, size=pool.max_sessions + 5) is pool
    assert pool.max_sessions == base.pool_size() + 5
    other = base.session_pool(LocalExecutor(base_dir=executor.base))
    assert other is not pool and isinstance(other, SandboxPool)
    other.close()
