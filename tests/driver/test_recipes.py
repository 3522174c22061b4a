"""The shipped recipes on real tasks: SWE-smith repositories and SETA / Terminal-Bench tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thundersync.config import load_run_config
from thundersync.driver.replay_gap import replay_gap
from thundersync.driver.run import RunDriver


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo-swe-smith-tiny", "opd-seta-tiny"])
def test_shipped_recipe_trains_on_real_tasks_and_equals_sync(tmp_path: Path, recipe: str) -> None:
    cfg = load_run_config(recipe, {"updates": 1, "rollout.groups_per_update": 1})
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0
    (m,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert m["sources"] > 0 and m["learner_tokens"] > 0
    spans = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert any(s["role"] == "tool" for s in spans)  # sandboxed tool calls ran
    if cfg.objective.value == "opd":
        assert any(s["role"] == "teacher" for s in spans) and m["grad_norm"] > 0
    assert max(replay_gap(tmp_path, cfg, tmp_path / "model")) <= 1e-6
