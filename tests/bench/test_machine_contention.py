"""The speedup bench's contention floor (two pinned compute loops) and its per-round prediction
check (`tsrl predict` on each round's sync run against the same round's stream run)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from thundersync.bench.machine_contention import measure
from thundersync.bench.predict import Contention
from thundersync.bench.speedup import prediction_errors
from thundersync.bench.speedup_stats import schedule_summary
from thundersync.bench.trace_synth import write_run
from thundersync.bench.workloads import grpo_update
from thundersync.rundir import RunFiles


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_probe_runs_a_loop_on_each_core_alone_then_both_together() -> None:
    res = measure(seconds=0.3, hidden=128)
    assert len(res["cores"]) == 2
    for c in map(str, res["cores"]):
        assert res["rate_alone"][c] > 0 and res["rate_together"][c] > 0
        assert res["slowdown"][c] == pytest.approx(res["rate_alone"][c] / res["rate_together"][c])
    assert res["slowdown_mean"] == pytest.approx(sum(res["slowdown"].values()) / 2)


def test_probe_on_one_core_says_nothing_overlaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    res = measure(seconds=0.1)
    assert res["slowdown"] == {} and "fewer than 2 cores" in res["note"]


def test_prediction_errors_pair_rounds_and_apply_the_machine_slowdown(tmp_path: Path) -> None:
    """Two rounds whose stream runs were 10% slower on both sides than the release model says:
    the plain prediction misses by more than 5%, with the machine's 1.1 it is within 1%."""
    rng = np.random.default_rng(7)
    c = Contention(rollout=1.1, learner=1.1)
    runs: dict[str, list[RunFiles]] = {"sync": [], "stream": []}
    for r in range(2):
        ups = [grpo_update(rng, rho=1.0, ranks=1) for _ in range(3)]
        runs["sync"].append(RunFiles(write_run(tmp_path / f"sync-r{r}", ups, "sync", rng=rng)))
        stream = [c.apply(u) for u in ups]
        runs["stream"].append(
            RunFiles(write_run(tmp_path / f"stream-r{r}", stream, "stream", rng=rng))
        )
    res = prediction_errors(runs, 1.1)
    assert res["rel_error"]["median"] > 0.05
    assert res["rel_error_with_machine_contention"]["max"] <= 0.01
    assert res["machine_slowdown"] == 1.1


def test_predicted_speedup_sits_between_1_and_the_overlap_bound(tmp_path: Path) -> None:
    """The release model on sync's own items (no contention) cannot beat the (R+L+P)/(max+P)
    bound: the learner's first source is ready only after the first trajectory finished."""
    rng = np.random.default_rng(3)
    runs: dict[str, list[RunFiles]] = {"sync": [], "stream": []}
    for r in range(2):
        ups = [grpo_update(rng, rho=1.0, ranks=1) for _ in range(3)]
        for k in runs:
            runs[k].append(RunFiles(write_run(tmp_path / f"{k}-r{r}", ups, k, rng=rng)))
    got = prediction_errors(runs, 1.0)["predicted_speedup"]
    bound = schedule_summary(runs["sync"])["bound"]
    assert 1.2 < got["min"] <= got["median"] <= got["max"] < bound
