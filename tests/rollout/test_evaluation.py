"""pass@k: the unbiased estimator, and `tsrl eval` with a fresh environment per attempt."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from thundersync.rollout.evaluation import load_tasks, pass_at_k, run_eval

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 5), (5, 5, 5), (7, 1, 3)]
)
def test_pass_at_k_equals_the_probability_that_a_random_k_subset_has_a_success(
    n: int, c: int, k: int
) -> None:
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_rejects_k_above_n() -> None:
    with pytest.raises(ValueError, match="at least k attempts"):
        pass_at_k(2, 1, 3)


@pytest.mark.parametrize(
    ("old", "new"),
    [("thundersync-swesmith", "tsrl-swesmith"), ("thundersync-terminal", "tsrl-terminal")],
)
def test_a_task_file_naming_a_retired_env_id_is_refused_with_the_new_id(
    tmp_path: Path, old: str, new: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"env_class": old, "prompt": [{"role": "user", "content": "x"}]}))
    with pytest.raises(
        ValueError, match=rf'tasks.jsonl:1: env_class .{old}. .*"env_class": "{new}"'
    ):
        load_tasks(path)
    path.write_text(json.dumps({"env_class": new, "prompt": []}))
    assert load_tasks(path)[0]["env_class"] == new


class CountingEnv(BaseTextEnv):
    """Reward 1 iff extras['solvable']; counts constructions and refuses reuse after done."""

    made = 0

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        CountingEnv.made += 1
        self.solvable = bool((extras or {}).get("solvable"))
        self.finished = False

    def step(self, action: str) -> BaseTextEnvStepOutput:
        assert not self.finished, "an environment was reused across attempts"
        self.finished = True
        return BaseTextEnvStepOutput(
            observations=[], reward=1.0 if self.solvable else 0.0, done=True, metadata={}
        )


def test_eval_runs_each_attempt_in_a_fresh_env(tiny_model_dir: Path, tmp_path: Path) -> None:
    if "tsrl-test-counting" not in skyrl_gym.registry:
        skyrl_gym.register(id="tsrl-test-counting", entry_point=f"{__name__}:CountingEnv")
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {
            "instance_id": "yes",
            "env_class": "tsrl-test-counting",
            "prompt": [{"role": "user", "content": "a"}],
            "env_extras": {"solvable": True},
        },
        {
            "instance_id": "no",
            "env_class": "tsrl-test-counting",
            "prompt": [{"role": "user", "content": "b"}],
            "env_extras": {"solvable": False},
        },
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    CountingEnv.made = 0
    res = run_eval(str(tiny_model_dir), str(tasks), attempts=3, max_new_tokens=2)
    assert CountingEnv.made == 6
    s = res["summary"]
    assert s["pass@1"] == s["pass@3"] == pytest.approx(0.5) and s["pass@5"] is None


def test_cli_eval_on_the_shipped_toy_fixtures_prints_json_last(tiny_model_dir: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "eval",
            "--model",
            str(tiny_model_dir),
            "--attempts",
            "5",
            "--max-new-tokens",
            "4",
            "--max-turns",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["tasks"] == 4 and res["attempts"] == 5
    assert {"pass@1", "pass@3", "pass@5"} <= set(res)
