"""`tsrl bench teacher` runs small and prints its JSON summary with the keys the README quotes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from thundersync.cli import app


def test_bench_teacher_prints_the_cost_ratios_and_the_gap_to_full_scoring() -> None:
    args = ["bench", "teacher", "--json", "--turns", "2,16", "--rounds", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    s = json.loads(res.output.strip().splitlines()[-1])
    for key in (
        "incremental_turn_cost_ratio_16_vs_2",
        "full_turn_cost_ratio_16_vs_2",
        "incremental_cpu_turn_cost_ratio_16_vs_2",
        "speedup_at_16_turns",
        "goal_met",
    ):
        assert key in s
    assert s["max_abs_diff_vs_full"] <= 1e-5
    # tokens, not seconds: flat for incremental scoring, growing with turns for full scoring
    assert s["incremental_tokens_per_turn_ratio_16_vs_2"] <= 1.0
    assert s["full_tokens_per_turn_ratio_16_vs_2"] > 3.0
    assert [r["turns"] for r in s["rows"]] == [2, 16]
