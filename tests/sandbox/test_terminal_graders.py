"""Terminal graders the policy cannot game: each cheat earns 0 with a reason; gold still earns 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from thundersync.sandbox.envs.check import check_terminal
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.terminal import load_task
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.local import LocalExecutor

FORCE_PASS_CONFTEST = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    rep.outcome = "passed"
"""
FAKE_PYTEST = """
import sys
for name in ("test_file_exists", "test_file_content"):
    print(f"PASSED ../tests/test_outputs.py::{name}")
    print(f"/tests/test_outputs.py::{name} PASSED")
sys.exit(0)
"""


def _create(path: str, content: str) -> str:
    return "<tool>create\n" + json.dumps({"path": path, "content": content}) + "</tool>"


def _episode(task: str | Path, executor: LocalExecutor, *actions: str) -> dict[str, Any]:
    env = TerminalEnv(extras={"task": str(task), "executor": executor})
    try:
        env.init()
        for a in actions:
            env.step(a)
        out = env.step("<tool>submit</tool>")
        assert out["done"]
        return {"reward": out["reward"], **out["metadata"]["verdict"]}
    finally:
        env.close()


HARBOR = TERMINAL_DIR / "harbor-sort-unique"
TB1 = TERMINAL_DIR / "tb1-hello-file"
REWARD_HACK = (
    "mkdir -p /logs/verifier && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json && "
    "echo 1 > /logs/verifier/reward.txt && chmod 444 /logs/verifier/reward.txt"
)


@pytest.mark.parametrize(
    ("task", "actions"),
    [
        # a pre-written reward.json / read-only reward.txt in the agent's /logs
        (HARBOR, [f"<tool>bash\n{REWARD_HACK}</tool>"]),
        # an edited test.sh / run-tests.sh / test file in /tests
        (
            HARBOR,
            [
                "<tool>bash\nmkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh</tool>"
            ],
        ),
        (
            TB1,
            [
                _create("/tests/run-tests.sh", "echo PASSED; exit 0"),
                _create(
                    "/tests/test_outputs.py",
                    "def test_file_exists(): pass\ndef test_file_content(): pass\n",
                ),
            ],
        ),
        # a conftest.py forcing passes, in /tests and in /app
        (
            TB1,
            [
                _create("/tests/conftest.py", FORCE_PASS_CONFTEST),
                _create("/app/conftest.py", FORCE_PASS_CONFTEST),
            ],
        ),
        # a pytest.py (and sitecustomize) on the runner's path printing PASSED lines
        (
            TB1,
            [_create("/app/pytest.py", FAKE_PYTEST), _create("/app/sitecustomize.py", FAKE_PYTEST)],
        ),
        # a background process that writes the reward after submit
        (
            HARBOR,
            [
                "<tool>bash\nnohup setsid bash -c 'for i in $(seq 100); do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.1; done' >/dev/null 2>&1 &</tool>"
            ],
        ),
    ],
    ids=[
        "reward-files",
        "edited-test-sh",
        "edited-run-tests",
        "conftest",
        "pytest-shadow",
        "background",
    ],
)
def test_terminal_cheats_earn_zero(
    local_executor: LocalExecutor, task: Path, actions: list[str]
) -> None:
    got = _episode(task, local_executor, *actions)
    assert got["reward"] == 0.0, got
    assert got["reason"]


def test_gold_still_earns_one_in_both_layouts(local_executor: LocalExecutor) -> None:
    for task in (TB1, HARBOR, TERMINAL_DIR / "seta-csv-summary"):
        out = check_terminal(task, local_executor)
        assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out


def _harbor_copy(tmp_path: Path, test_sh: str) -> Path:
    task = tmp_path / "h"
    shutil.copytree(HARBOR, task)
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


@pytest.mark.parametrize("value", ["1.5", "inf", "nan", "-0.5"])
def test_out_of_range_rewards_are_refused_not_clamped(
    local_executor: LocalExecutor, tmp_path: Path, value: str
) -> None:
    task = _harbor_copy(tmp_path, f"echo {value} > /logs/verifier/reward.txt\n")
    got = _episode(task, local_executor)
    assert got["reward"] == 0.0 and "reward.txt" in got["reason"], got
    assert "finite number in [0, 1]" in got["reason"]


def test_reward_json_value_outside_range_names_the_key(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    task = _harbor_copy(tmp_path, "echo '{\"reward\": 2}' > /logs/verifier/reward.json\n")
    got = _episode(task, local_executor)
    assert got["reward"] == 0.0 and "reward.json key 'reward'" in got["reason"], got


def test_failing_verifier_reason_shows_its_output(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    task = _harbor_copy(
        tmp_path, "echo 'checked sorted.txt: MISSING'; echo 0 > /logs/verifier/reward.txt\n"
    )
    got = _episode(task, local_executor)
    assert got["reward"] == 0.0 and "checked sorted.txt: MISSING" in got["reason"], got


def test_tb1_without_run_tests_uses_the_default_runner(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    task = tmp_path / "t"
    shutil.copytree(TB1, task)
    (task / "run-tests.sh").unlink()
    assert load_task(task).verifier is None
    out = check_terminal(task, local_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
