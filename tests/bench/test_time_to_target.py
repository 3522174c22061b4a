"""`tsrl bench time-to-target` on a very small configuration (about 30 s on 2 cores), plus the
pure summary on hand-made curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thundersync.bench.time_to_target import Point, reward_at, summarize, time_to_target
from thundersync.cli import app

SMALL = [
    "model.tiny_hidden=64",
    "model.tiny_layers=2",
    "rollout.groups_per_update=2",
    "rollout.group_size=4",
    "rollout.max_turns=1",
    "rollout.max_new_tokens=6",
    "optim.lr=0.01",
]


def _pts(rewards: list[float], step: float, stale: int = 0) -> list[Point]:
    return [
        Point(k, (k + 1) * step, r, stale if k else 0, step, 1.0 + r) for k, r in enumerate(rewards)
    ]


def test_summary_times_budget_and_ratios() -> None:
    rs = [0.1, 0.3, 0.6, 0.9]
    curves = {
        "sync": _pts(rs, 2.0),
        "stream": _pts(rs, 1.0),
        "async": _pts([0.1, 0.1, 0.3, 0.6], 1.0, stale=1),
    }
    assert time_to_target(curves["sync"], 0.5) == 6.0
    assert time_to_target(curves["sync"], 0.95) is None
    assert reward_at(curves["sync"], 5.0) == 0.3
    assert reward_at(curves["sync"], 1.0) is None
    s = summarize(curves, target=0.5, budget_s=None)
    assert s["budget_s"] == 4.0  # half of sync's wall time
    assert s["stream_vs_sync_time_to_target"] == 2.0
    assert s["stream_vs_async_time_to_target"] == pytest.approx(4.0 / 3.0)
    assert s["sync_stream_curves_equal"]
    assert s["stale_curves_differ"] == {"async": True}
    assert s["max_staleness"] == {"sync": 0, "stream": 0, "async": 1}
    assert s["reward_at_budget"] == {"sync": 0.3, "stream": 0.9, "async": 0.6}
    curves["stream"] = _pts([0.1, 0.3, 0.61, 0.9], 1.0)
    assert not summarize(curves, target=0.5, budget_s=3.0)["sync_stream_curves_equal"]


def test_bench_time_to_target_small_run(tmp_path: Path) -> None:
    png = tmp_path / "ttt.png"
    args = ["bench", "time-to-target", "--json", "--updates", "3", "--target", "0.02"]
    args += ["--out", str(tmp_path / "runs"), "--plot", str(png)]
    for kv in SMALL:
        args += ["--set", kv]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout.strip().splitlines()[-1])
    for key in (
        "stream_vs_sync_time_to_target",
        "time_to_target_s",
        "reward_at_budget",
        "max_staleness",
        "sync_stream_curves_equal",
        "reward_curve_gap_vs_sync",
        "stale_curves_differ",
        "budget_s",
        "goal_met",
        "plot",
    ):
        assert key in s, key
    assert set(s["schedules"]) == {"sync", "stream", "async", "fully_async"}
    sync = [p["reward"] for p in s["schedules"]["sync"]["curve"]]
    stream = [p["reward"] for p in s["schedules"]["stream"]["curve"]]
    assert len(sync) == 3 and sync == stream  # lossless: the same reward per update, exactly
    assert s["sync_stream_curves_equal"]
    assert s["max_staleness"]["sync"] == 0 and s["max_staleness"]["stream"] == 0
    assert s["max_staleness"]["async"] > 0
    assert s["plot"] == str(png) and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
