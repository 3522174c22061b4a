"""`grpo-smollm2-terminal` end to end, small: SmolLM2-135M-Instruct is the policy on the built-in
one-command terminal tasks, every reward the learner applies is a verifier's verdict, the update
moves the parameters, and the streamed run equals sync on replay (gap 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from thundersync.bus.events import GrpoRewardReady, decode_event
from thundersync.config import ConfigError, load_run_config
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import RunDriver
from thundersync.rollout.checkpoint import load_state_dict
from thundersync.rundir import RunFiles
from thundersync.sandbox.envs import terminal_env
from thundersync.smollm2 import smollm2_dir

# the sizes a user would pass with --set; seed 0's one group of 2 (easy-pwd-file) earns 0.0 and
# 0.5 here, so GRPO has a non-zero direction
SMALL = {"updates": 2, "rollout.group_size": 2, "rollout.groups_per_update": 1}


@pytest.mark.slow  # ~90 s here: two SmolLM2 learners (the run's and the replay's)
def test_smollm2_policy_trains_on_verifier_rewards_and_equals_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verdicts: list[float] = []
    real_verify = terminal_env.verify

    def recorded(*args: Any, **kw: Any) -> Any:  # rollouts run in this process: see each verdict
        verdict = real_verify(*args, **kw)
        verdicts.append(verdict.reward)
        return verdict

    monkeypatch.setattr(terminal_env, "verify", recorded)
    cfg = load_run_config("grpo-smollm2-terminal", SMALL)
    assert cfg.model.path == "smollm2" and cfg.schedule.value == "stream"
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0

    m, _ = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    files = RunFiles(tmp_path)
    paths = files.batch_logs()[0]
    lines = [x for p in paths for x in p.read_text().splitlines() if x.strip()]
    events = [decode_event(x) for x in lines]
    rewards = [e.reward for e in events if isinstance(e, GrpoRewardReady)]
    assert len(rewards) == 2 and sorted(rewards) == sorted(verdicts[:2])  # the verifier's only
    assert len(set(rewards)) == 2, f"the group needs reward variance to move theta: {rewards}"
    assert m["reward_mean"] == pytest.approx(sum(verdicts[:2]) / 2)
    assert m["grad_norm"] > 0 and m["version"] == 1

    base = load_state_dict(smollm2_dir())
    after = load_state_dict(files.weights(1))
    assert any(not after[k].equal(v) for k, v in base.items()), "the update changed no parameter"
    # a caller with more threads than the run's learner (the CLI's default): the replay must
    # still use the learner's count, or SmolLM2's fp32 matmuls round differently (5.9e-5 from
    # update 1 on; update 0 hides it: AdamW's first step is sign-like)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert replay_gap(tmp_path, cfg, smollm2_dir()) == [0.0, 0.0]
    finally:
        torch.set_num_threads(before)


def test_bad_builtin_names_are_config_errors_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="env.tasks 'terminal-easy'.*env.name=terminal"):
        load_run_config("grpo-smollm2-terminal", {"env.name": "toy", "env.examples": []})
    with pytest.raises(ConfigError, match="env.examples: only env.name=terminal"):
        load_run_config("grpo-toy", {"env.examples": [{"user": "u", "assistant": "a"}]})
    with pytest.raises(ConfigError, match=r"env.examples.0.assistant"):
        load_run_config("grpo-smollm2-terminal", {"env.examples": [{"user": "u"}]})
