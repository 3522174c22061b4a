from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import skyrl_gym

import thundersync.sandbox.envs  # noqa: F401  (registers the envs)
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.terminal import Layout, TaskError, load_task


def test_both_layouts_load_with_timeouts_weights_and_limits() -> None:
    seta = load_task(TERMINAL_DIR / "seta-csv-summary")
    assert seta.layout is Layout.TB1 and seta.weights and seta.test_timeout == 60
    harbor = load_task(TERMINAL_DIR / "harbor-log-errors")
    assert harbor.layout is Layout.HARBOR and harbor.limits.memory_mb == 512 and not harbor.network


def test_malformed_task_dirs_name_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "t"
    shutil.copytree(TERMINAL_DIR / "seta-csv-summary", bad)
    (bad / "task.yaml").write_text("max_test_timeout_sec: 5\n")
    with pytest.raises(TaskError, match=r"task.yaml: field 'instruction'"):
        load_task(bad)
    (bad / "task.yaml").write_text("instruction: x\nmax_test_timeout_sec: -1\n")
    with pytest.raises(TaskError, match="max_test_timeout_sec"):
        load_task(bad)
    (bad / "task.yaml").write_text("instruction: x\n")
    (bad / "weights.json").write_text('{"test_rows": "heavy"}')
    with pytest.raises(TaskError, match=r"weights.json: weight of 'test_rows'"):
        load_task(bad)
    with pytest.raises(TaskError, match="expected task.yaml"):
        load_task(tmp_path)
    h = tmp_path / "h"
    shutil.copytree(TERMINAL_DIR / "harbor-sort-unique", h)
    (h / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"tests/test.sh: missing"):
        load_task(h)


def test_partial_weights_give_partial_reward() -> None:
    env = skyrl_gym.make("tsrl-terminal", extras={"task": str(TERMINAL_DIR / "seta-csv-summary")})
    try:
        env.init([])
        body = json.dumps(
            {"path": "summary.json", "content": '{"rows": 5, "total": 0, "max_region": "north"}'}
        )
        env.step(f"<tool>create\n{body}</tool>")
        out = env.step("<tool>submit</tool>")
        # exists (1) + rows (1) + max_region (2) of 6
        assert out["done"] and out["reward"] == pytest.approx(4 / 6)
        assert out["metadata"]["verdict"]["tests"]["test_total"] == "FAILED"
    finally:
        env.close()


def test_agent_cannot_see_tests_before_verification() -> None:
    env = skyrl_gym.make("tsrl-terminal", extras={"task": str(TERMINAL_DIR / "tb1-hello-file")})
    try:
        env.init([])
        out = env.step("<tool>bash\nls -A /tests /logs; ls /app</tool>")
        assert "test_outputs" not in out["observations"][0]["content"]
    finally:
        env.close()


def test_env_check_all_gold_earns_one_and_noop_zero() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "env", "check", "--all", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["tasks"] >= 24  # the issue-15 acceptance count, on the local backend too
    assert summary["gold_ok"] == summary["noop_ok"] == summary["tasks"], summary["details"]
    kinds = {d["kind"] for d in summary["details"]}
    assert kinds == {"swesmith", "tb1", "harbor"}
    assert out.returncode == 0


def test_env_check_single_task_path_and_bad_path_error(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "env",
            "check",
            str(TERMINAL_DIR / "harbor-sort-unique"),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert json.loads(ok.stdout.splitlines()[-1])["gold_ok"] == 1
    bad = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "env", "check", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "expected task.yaml" in bad.stderr


def test_harbor_memory_strings_steps_and_missing_solution(tmp_path: Path) -> None:
    h = tmp_path / "h"
    shutil.copytree(TERMINAL_DIR / "harbor-sort-unique", h)
    toml = (h / "task.toml").read_text()
    body = "\n".join(line for line in toml.splitlines() if not line.startswith("memory"))
    (h / "task.toml").write_text(body.replace("[environment]", '[environment]\nmemory = "2G"'))
    assert load_task(h).limits.memory_mb == 2048
    (h / "task.toml").write_text(body.replace("[environment]", '[environment]\nmemory = "lots"'))
    with pytest.raises(TaskError, match=r"task.toml: \[environment\] memory must be a size"):
        load_task(h)
    (h / "task.toml").write_text(body)
    shutil.rmtree(h / "solution")
    assert load_task(h).solution is None  # loads for training; the gold check says so
    (h / "task.toml").write_text(body + '\n[[steps]]\nname = "one"\n')
    with pytest.raises(TaskError, match=r"steps/one/instruction.md: missing"):
        load_task(h)  # multi-step tasks load (test_terminal_harness); each step needs its folder


def test_weight_naming_no_test_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "t"
    shutil.copytree(TERMINAL_DIR / "seta-csv-summary", bad)
    weights = json.loads((bad / "weights.json").read_text())
    (bad / "weights.json").write_text(json.dumps({**weights, "test_does_not_exist": 1}))
    with pytest.raises(TaskError, match=r"weights.json: weight for 'test_does_not_exist' names no"):
        load_task(bad)


def test_env_check_of_a_task_without_solution_says_gold_unchecked(tmp_path: Path) -> None:
    h = tmp_path / "harbor-no-solution"
    shutil.copytree(TERMINAL_DIR / "harbor-sort-unique", h)
    shutil.rmtree(h / "solution")
    cmd = [sys.executable, "-m", "thundersync.cli", "env", "check", str(h)]
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    summary = json.loads(js.stdout.splitlines()[-1])
    assert js.returncode == 0, js.stderr
    assert (summary["tasks"], summary["gold_ok"], summary["gold_unchecked"]) == (1, 0, 1)
    assert summary["noop_ok"] == 1 and "gold not checked" in summary["details"][0]["gold_reason"]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0 and "gold=n/a" in text.stdout, text.stdout + text.stderr


def test_local_verifier_can_write_data_and_output(tmp_path: Path) -> None:
    """TB1 runners that write outside /app (as a root verifier in the task's container would)
    earn gold 1 on the local backend too, where / is read-only and the verifier is uid 65534."""
    t = tmp_path / "tb1-writes-output"
    shutil.copytree(TERMINAL_DIR / "tb1-hello-file", t)
    runner = (
        (t / "run-tests.sh")
        .read_text()
        .replace(
            "cd /app\n",
            "mkdir -p /output/logs /data && echo run > /output/logs/run.txt && cp /app/hello.txt /data/"
            " || exit 3\n"
            "cd /app\n",
        )
    )
    (t / "run-tests.sh").write_text(runner)
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "env", "check", str(t), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads(out.stdout.splitlines()[-1])
    assert (summary["gold_ok"], summary["noop_ok"]) == (1, 1), summary["details"]
