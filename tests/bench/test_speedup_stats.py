"""`tsrl bench speedup`'s per-schedule numbers, read from a hand-written run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thundersync.bench.speedup_stats import bound, schedule_summary, spread, update_phases
from thundersync.rundir import RunFiles


def _run_dir(root: Path) -> RunFiles:
    """Update 1 starts at t=100: rollout closes at 103 (R 3), two content items (the second runs
    on past the rollout's close: 0.5 s of suffix), a reward item, then the barrier."""
    rd = RunFiles(root)
    root.mkdir(parents=True)
    metrics = [
        {
            "update": 0,
            "time": 99.0,
            "step_s": 9.0,
            "rollout_s": 5.0,
            "learner_busy_s": 5.0,
            "barrier_s": 1.0,
            "idle_share": 0,
        },
        {
            "update": 1,
            "time": 104.0,
            "step_s": 4.0,
            "rollout_s": 3.0,
            "learner_busy_s": 2.5,
            "barrier_s": 0.4,
            "idle_share": 0.1,
        },
    ]
    spans = [
        (0, "learner", "work_item", "GrpoContent", 95.0, 99.0),  # warm-up update: left out
        (1, "learner", "work_item", "GrpoContent", 100.5, 102.0),
        (1, "learner", "work_item", "GrpoContent", 102.5, 103.5),
        (1, "learner", "work_item", "GrpoReward", 103.5, 103.6),
        (1, "rollout", "generate", "", 100.0, 103.0),  # not the learner's time
        (1, "barrier", "barrier", "", 103.6, 104.0),
    ]
    rd.metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    rd.spans.write_text(
        "".join(
            json.dumps(
                {"type": "span", "update": u, "role": role, "kind": kind, "start": s, "end": e}
                | ({"ids": {"kind": ik}} if ik else {})
            )
            + "\n"
            for u, role, kind, ik, s, e in spans
        )
    )
    return rd


def test_learner_time_is_split_by_work_item_kind_with_the_suffix_after_rollout_close(
    tmp_path: Path,
) -> None:
    [phases] = update_phases(_run_dir(tmp_path / "run"))
    assert phases["GrpoContent"] == pytest.approx(1.5 + 1.0)
    assert phases["GrpoReward"] == pytest.approx(0.1)
    assert phases["barrier"] == pytest.approx(0.4)
    assert phases["suffix_s"] == pytest.approx(0.5 + 0.1)  # 103 -> 103.5, 103.5 -> 103.6


def test_schedule_summary_skips_the_warm_up_update_and_takes_its_bound(tmp_path: Path) -> None:
    s = schedule_summary([_run_dir(tmp_path / "run")])
    assert (s["R"], s["L"], s["P"], s["updates"]) == (3.0, 2.5, 0.4, 1)
    assert s["bound"] == pytest.approx((3.0 + 2.5 + 0.4) / (3.0 + 0.4))
    assert s["step_s"] == {"median": 4.0, "min": 4.0, "max": 4.0}


def test_bound_and_spread_of_edge_cases() -> None:
    assert bound(1.0, 1.0, 0.0) == 2.0 and bound(0.0, 0.0, 0.0) == 1.0
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert spread([]) == {"median": 0.0, "min": 0.0, "max": 0.0}
