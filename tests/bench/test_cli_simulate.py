from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from thundersync.cli import app


def test_bench_simulate_reproduces_every_trend_with_zero_bound_violations(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["bench", "simulate", "--json", "--out", str(tmp_path), "--samples", "6"]
    )
    assert res.exit_code == 0, res.output
    s = json.loads(res.output.strip().splitlines()[-1])
    assert s["bound_violations"] == 0
    assert s["schedule_order_violations"] == 0
    assert s["tail_bound_violations"] == 0
    assert s["max_speedup"] <= 2.0
    assert s["balanced_speedup"] >= 1.9
    assert s["grpo_heterogeneity_rises"]
    assert s["grpo_speedup_high_het"] > s["grpo_speedup_low_het"]
    assert s["waves_approach_2"]
    assert s["opd_ge_grpo"]
    assert all(Path(p).exists() for p in s["plots"])
