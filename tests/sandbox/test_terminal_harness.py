"""Terminal tasks run as their harnesses run them: Harbor's reward order and named scores, the
verifier's scripts from memory and no process outliving it, multi-step tasks, app/ only when the
Dockerfile copies it (local backend here; docker in test_terminal_harness_docker)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from thundersync.sandbox.envs.check import check_terminal
from thundersync.sandbox.envs.fixtures import TERMINAL_DIR
from thundersync.sandbox.envs.hacks import run_hack
from thundersync.sandbox.envs.hacks_harbor import HACKS_HARBOR
from thundersync.sandbox.envs.terminal import TaskError, load_task
from thundersync.sandbox.envs.terminal_env import TerminalEnv
from thundersync.sandbox.envs.terminal_reward import network_hint
from thundersync.sandbox.local import LocalExecutor

MULTI_STEP = TERMINAL_DIR / "harbor-multi-step"
MULTI_REWARD = TERMINAL_DIR / "harbor-multi-reward"
IMPORTS = TERMINAL_DIR / "harbor-verifier-imports"


def _harbor(tmp_path: Path, test_sh: str, src: Path = IMPORTS) -> Path:
    task = tmp_path / "h"
    shutil.copytree(src, task)
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


def _submit(env: TerminalEnv) -> dict[str, Any]:
    out = env.step("<tool>submit</tool>")
    assert out["done"], out
    return {
        "reward": out["reward"],
        "scores": out["metadata"]["scores"],
        **out["metadata"]["verdict"],
    }


def _episode(task: Path, ex: LocalExecutor, *actions: str, **extras: Any) -> dict[str, Any]:
    env = TerminalEnv(extras={"task": str(task), "executor": ex, **extras})
    try:
        env.init()
        for a in actions:
            env.step(a)
        return _submit(env)
    finally:
        env.close()


def test_reward_txt_is_read_before_reward_json(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    both = "echo 0 > /logs/verifier/reward.txt; echo '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"
    got = _episode(_harbor(tmp_path, both), local_executor)
    assert got["reward"] == 0.0 and got["reason"].startswith("reward.txt"), got
    assert got["scores"] == {"reward": 0.0}


def test_named_scores_kept_and_the_trained_key_chosen(local_executor: LocalExecutor) -> None:
    out = check_terminal(MULTI_REWARD, local_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
    # a correct but untidy answer: "correct" (the task's reward_key) is trained on, not the mean
    untidy = '<tool>bash\npython3 -c "print(*[n for n in range(2,50) if all(n%d for d in range(2,n))], sep=chr(10)+chr(10))" > primes.txt</tool>'
    got = _episode(MULTI_REWARD, local_executor, untidy)
    assert got["reward"] == 1.0 and got["scores"] == {"correct": 1.0, "tidy": 0.0}, got
    # the recipe's choice (env extras reward_key) wins over the task's
    got = _episode(MULTI_REWARD, local_executor, untidy, reward_key="tidy")
    assert got["reward"] == 0.0 and got["scores"] == {"correct": 1.0, "tidy": 0.0}, got
    got = _episode(MULTI_REWARD, local_executor, untidy, reward_key="nope")
    assert got["reward"] == 0.0 and "no key 'nope'" in got["reason"], got


@pytest.mark.parametrize("hack", HACKS_HARBOR, ids=lambda h: h.name)
def test_imported_agent_code_cannot_forge_the_reward(
    local_executor: LocalExecutor, hack: Any
) -> None:
    env = TerminalEnv(extras={"task": str(IMPORTS), "executor": local_executor})
    try:
        got = run_hack(hack, env)
    finally:
        env.close()
    assert got["reward"] == 0.0 and got["defeated"], got


def test_a_leftover_process_voids_the_verdict(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    script = "echo 1 > /logs/verifier/reward.txt; (setsid sleep 30 &) ; exit 0\n"
    got = _episode(_harbor(tmp_path, script), local_executor)
    assert got["reward"] == 0.0 and "outlived the verifier" in got["reason"], got
    assert "sleep 30" in got["reason"]


def test_appended_lines_of_the_running_script_never_run(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    script = (
        "echo 'echo 1 > /logs/verifier/reward.txt' >> /tests/test.sh\n"
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    got = _episode(_harbor(tmp_path, script), local_executor)
    assert got["reward"] == 0.0 and got["reason"].startswith("reward.txt: 0"), got


def test_multi_step_gold_noop_and_partial(local_executor: LocalExecutor) -> None:
    out = check_terminal(MULTI_STEP, local_executor)
    assert (out["gold_reward"], out["noop_reward"]) == (1.0, 0.0), out
    task = load_task(MULTI_STEP)
    env = TerminalEnv(extras={"task": str(MULTI_STEP), "executor": local_executor})
    try:
        prompt, _ = env.init()
        assert prompt[-1]["content"] == task.steps[0].instruction
        env.step(f"<tool>bash\n{task.steps[0].solution.read_text()}</tool>")  # type: ignore[union-attr]
        mid = env.step("<tool>submit</tool>")
        assert not mid["done"] and task.steps[1].instruction in mid["observations"][0]["content"]
        ls = env.step("<tool>bash\ncat sorted.txt</tool>")  # the trajectory goes on, same /app
        assert "apple\nbanana\ncherry" in ls["observations"][0]["content"]
        got = _submit(env)
    finally:
        env.close()
    assert got["reward"] == 0.5, got  # step 1 solved, step 2 not: the mean
    assert got["scores"] == {"01-create/reward": 1.0, "02-extend/reward": 0.0}


def test_multi_step_min_reward_stops_early_and_final(
    local_executor: LocalExecutor, tmp_path: Path
) -> None:
    task = tmp_path / "ms"
    shutil.copytree(MULTI_STEP, task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        toml.replace('name = "01-create"', 'name = "01-create"\nmin_reward = 1.0')
    )
    env = TerminalEnv(extras={"task": str(task), "executor": local_executor})
    try:
        env.init()
        out = env.step("<tool>submit</tool>")
    finally:
        env.close()
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["end"] == "min_reward"
    assert "not reached: ['02-extend']" in out["metadata"]["verdict"]["reason"]
    (task / "task.toml").write_text(toml.replace('"mean"', '"final"'))
    assert load_task(task).step_reward == "final"
    out2 = check_terminal(task, local_executor)
    assert (out2["gold_reward"], out2["noop_reward"]) == (1.0, 0.0), out2


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ('skills_dir = "/skills"\n', r"task.toml: skills_dir: agent skills are not supported"),
        ('multi_step_reward_strategy = "max"\n', r'multi_step_reward_strategy must be "mean"'),
    ],
)
def test_harbor_refusals_name_file_and_field(tmp_path: Path, edit: str, match: str) -> None:
    task = tmp_path / "ms"
    shutil.copytree(MULTI_STEP, task)
    toml = (task / "task.toml").read_text().replace('multi_step_reward_strategy = "mean"\n', "")
    (task / "task.toml").write_text(edit + toml)
    with pytest.raises(TaskError, match=match):
        load_task(task)


def test_unknown_step_fields_and_step_environments_are_refused(tmp_path: Path) -> None:
    task = tmp_path / "ms"
    shutil.copytree(MULTI_STEP, task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        toml.replace('name = "02-extend"', 'name = "02-extend"\nuser = "x"')
    )
    with pytest.raises(TaskError, match=r"#2 \(02-extend\): field 'user' is not supported"):
        load_task(task)
    (task / "task.toml").write_text(toml)
    (task / "steps/01-create/environment").mkdir()
    with pytest.raises(TaskError, match=r"steps/01-create/environment: per-step environment"):
        load_task(task)


def test_app_folder_seeds_app_only_when_the_dockerfile_copies_it(tmp_path: Path) -> None:
    assert load_task(TERMINAL_DIR / "tb1-app-not-copied").app_seed is None
    task = tmp_path / "t"
    shutil.copytree(TERMINAL_DIR / "tb1-app-not-copied", task)
    (task / "Dockerfile").write_text(
        "FROM thundersync-sandbox:bookworm\nWORKDIR /app\nCOPY app/ /app/\n"
    )
    assert load_task(task).app_seed == task / "app"
    (task / "Dockerfile").unlink()  # no Dockerfile: the sandbox base with the seed, as before
    assert load_task(task).app_seed == task / "app"


def test_verifier_network_default_is_stated(tmp_path: Path) -> None:
    task = _harbor(tmp_path, "apt-get install -y jq\necho 1 > /logs/verifier/reward.txt\n")
    toml = (task / "task.toml").read_text().replace('network_mode = "no-network"\n', "")
    (task / "task.toml").write_text(toml)
    note = load_task(task).network_note
    assert "network unset, so off" in note and "Harbor's is on" in note and "test.sh" in note
    (task / "task.toml").write_text(
        toml.replace("[verifier]", '[verifier]\nnetwork_mode = "public"')
    )
    assert load_task(task).network_note == ""
    assert "without network" in network_hint("E: Method http has died unexpectedly!", False)
    assert network_hint("E: Method http has died unexpectedly!", True) == ""
    tb1 = tmp_path / "tb1"
    shutil.copytree(TERMINAL_DIR / "tb1-hello-file", tb1)
    assert load_task(tb1).network_note == ""
    (tb1 / "run-tests.sh").write_text("pip install pytest\npython3 -m pytest /tests\n")
    assert "Terminal-Bench 1's is on" in load_task(tb1).network_note
