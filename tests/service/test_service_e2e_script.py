"""`scripts/service_e2e.py` as a user runs it: a real `tsrl serve` subprocess, a sync and a stream
run of a recipe submitted over the API (recorded), both replay-checked against sync from theta_0,
the stream run's speedup and time to target from the API and its dashboard page in Chromium.
grpo-toy keeps it short; the SmolLM2 numbers in the README come from the same script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "service_e2e.py"


def test_a_recipe_runs_through_the_service_and_equals_sync(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--recipe", "grpo-toy", "--updates", "2"]
        + ["--out", str(tmp_path), "--target", "-1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads((tmp_path / "service_e2e.json").read_text())
    sync, stream = out["runs"]["sync"], out["runs"]["stream"]
    for run in (sync, stream):
        assert run["status"] == "succeeded"
        assert run["replay"]["gaps"] == [0.0, 0.0] and run["replay"]["equal_to_sync"]
    assert stream["replay"]["schedule"] == "stream" and sync["replay"]["schedule"] == "sync"
    # lossless: the same curve per update (a mean of the same rewards, summed in arrival order)
    assert stream["rewards"] == pytest.approx(sync["rewards"], rel=1e-12)
    assert out["speedup"]["baseline_id"] == sync["id"] and out["speedup"]["speedup"] > 0
    # a target every update reaches: both runs reach it at update 0, so a ratio is given
    ttt = out["time_to_target"]
    assert ttt["baseline_id"] == sync["id"] and ttt["ratio"] > 0
    assert out["dashboard"]["reward_chart"] == pytest.approx(stream["rewards"], rel=1e-12)
    assert out["dashboard"]["ttt_chart_points"] == [2, 2, 2]
    assert Path(out["dashboard"]["screenshot"]).stat().st_size > 10_000
