"""Named scores of multi-reward Harbor tasks: every reward.json key is an update metric
(metrics.jsonl `score/<name>`: its mean over the update's trajectories that reported it, served by
the service's updates API as `scores`), and the training reward is the key the task names
(task.toml `[verifier] reward_key`) unless the run config's `env.reward_key` names another. Real
driver, learner process, agent loop, local sandbox and verifier; the verifier's verdicts are only
recorded (the wrapped `verify` is the real one), as the rollouts run in this process."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from thundersync.bus.events import GrpoRewardReady, decode_event
from thundersync.config import ConfigError, RunConfig, load_run_config
from thundersync.driver.run import RunDriver
from thundersync.driver.tasks import plan_update, task_pool
from thundersync.rundir import RunFiles
from thundersync.sandbox.envs import terminal_env
from thundersync.sandbox.envs.fixtures import FIXTURES
from thundersync.service.launcher.ingest import _update_row
from thundersync.service.schemas import UpdatePublic
from thundersync.service.tables import Run

FIXTURE = FIXTURES / "terminal" / "harbor-multi-reward"
# a second task: the fixture whose verifier also reports `style`, a score the first never reports
STYLE = "harbor-multi-reward-style"


def _task_set(root: Path) -> Path:
    shutil.copytree(FIXTURE, root / FIXTURE.name)
    shutil.copytree(FIXTURE, root / STYLE)
    test = root / STYLE / "tests" / "test.sh"
    text = test.read_text()
    old = '"tidy": 1.0 if tidy else 0.0}'
    assert old in text
    test.write_text(text.replace(old, '"tidy": 1.0 if tidy else 0.0, "style": 0.5}'))
    return root


def _cfg(tasks: Path, **over: object) -> RunConfig:
    """1 update of 2 groups of 2 on the toy model; a seed whose update draws both tasks."""
    base: dict[str, Any] = {
        "updates": 1,
        "rollout.groups_per_update": 2,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "env.name": "terminal",
        "env.tasks": str(tasks),
    }
    for seed in range(20):
        cfg = load_run_config("grpo-toy", base | {"seed": seed} | over)
        drawn = {p.task.instance_id.split("-", 2)[2] for p in plan_update(cfg, task_pool(cfg), 0)}
        if drawn == {FIXTURE.name, STYLE}:
            return cfg
    raise AssertionError("no seed below 20 draws both tasks")


def _run(cfg: RunConfig, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    verdicts: list[Any] = []
    real = terminal_env.verify

    def recorded(*args: Any, **kw: Any) -> Any:
        verdict = real(*args, **kw)
        verdicts.append(verdict)
        return verdict

    monkeypatch.setattr(terminal_env, "verify", recorded)
    assert RunDriver(cfg, run_dir, log_batches=True).run() == 0
    assert len(verdicts) == 4
    return verdicts


def _metrics(run_dir: Path) -> dict[str, Any]:
    (rec,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rec


def _applied_rewards(run_dir: Path) -> list[float]:
    paths = RunFiles(run_dir).batch_logs()[0]
    lines = [x for p in paths for x in p.read_text().splitlines() if x.strip()]
    return [e.reward for e in map(decode_event, lines) if isinstance(e, GrpoRewardReady)]


def _means(verdicts: list[Any]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for v in verdicts:
        for k, x in v.scores.items():
            by.setdefault(k, []).append(x)
    return {f"score/{k}": sum(x) / len(x) for k, x in by.items()}


@pytest.mark.slow
def test_named_scores_are_update_metrics_and_the_task_key_is_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(_task_set(tmp_path / "tasks"))
    run_dir = tmp_path / "run"
    verdicts = _run(cfg, run_dir, monkeypatch)
    rec = _metrics(run_dir)
    # every trajectory reported correct and tidy; only the second task's two reported style
    assert sorted(len(v.scores) for v in verdicts) == [2, 2, 3, 3]
    scores = {k: v for k, v in rec.items() if k.startswith("score/")}
    assert scores == pytest.approx(_means(verdicts))
    assert set(scores) == {"score/correct", "score/tidy", "score/style"}
    assert scores["score/style"] == 0.5  # its mean over the 2 that reported it, not over 4
    # the task's reward_key (correct) is what the learner got, never the mean of the scores
    assert sorted(_applied_rewards(run_dir)) == sorted(v.scores["correct"] for v in verdicts)
    assert all("reward.json (correct)" in v.reason for v in verdicts)
    assert rec["reward_mean"] == pytest.approx(scores["score/correct"])
    # the service ingests the line and its updates API serves the means by name
    row = UpdatePublic.model_validate(_update_row(Run(id=uuid.uuid4(), schedule="stream"), rec))
    assert row.scores == pytest.approx({k.removeprefix("score/"): v for k, v in scores.items()})


@pytest.mark.slow
def test_env_reward_key_picks_the_trained_score(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """env.reward_key=style: the task that reports it trains on 0.5, the one without it earns 0
    with a reason naming the key (never silently another score)."""
    cfg = _cfg(_task_set(tmp_path / "tasks"), **{"env.reward_key": "style"})
    run_dir = tmp_path / "run"
    verdicts = _run(cfg, run_dir, monkeypatch)
    rec = _metrics(run_dir)
    styled = [v for v in verdicts if "style" in v.scores]
    missing = [v for v in verdicts if "style" not in v.scores]
    assert len(styled) == len(missing) == 2
    assert all(v.reward == 0.5 and "reward.json (style)" in v.reason for v in styled)
    for v in missing:
        assert v.reward == 0.0
        assert "no key 'style'" in v.reason and "env.reward_key" in v.reason
        assert set(v.scores) == {"correct", "tidy"}  # its named scores are still metrics
    assert sorted(_applied_rewards(run_dir)) == [0.0, 0.0, 0.5, 0.5]
    assert rec["reward_mean"] == pytest.approx(0.25)  # correct (the task's key) would give 0
    assert rec["score/style"] == 0.5
    assert {k: v for k, v in rec.items() if k.startswith("score/")} == pytest.approx(
        _means(verdicts)
    )


def test_bad_env_reward_key_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"env\.reward_key is empty.*reward\.json key"):
        load_run_config("grpo-toy", {"env.name": "terminal", "env.reward_key": " "})
    with pytest.raises(ConfigError, match=r"env\.reward_key: only env\.name=terminal"):
        load_run_config("grpo-toy", {"env.reward_key": "correct"})
    # a good one reaches every terminal task's env extras
    cfg = _cfg(_task_set(tmp_path), **{"env.reward_key": "tidy"})
    assert {ref.extras["reward_key"] for ref in task_pool(cfg)} == {"tidy"}
    plain = load_run_config("grpo-toy", {"env.name": "terminal", "env.tasks": str(tmp_path)})
    assert all("reward_key" not in ref.extras for ref in task_pool(plain))
