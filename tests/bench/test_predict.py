from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from thundersync.bench.predict import TraceError, check, load_trace, predict, summary
from thundersync.bench.simulator import simulate
from thundersync.bench.trace_synth import write_run
from thundersync.bench.workloads import grpo_update, opd_update
from thundersync.cli import app


def _pair(tmp_path: Path, seed: int, noise: float, make=grpo_update) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    ups = [make(rng, rho=float(rng.uniform(0.5, 1.5)), ranks=2) for _ in range(5)]
    sync = write_run(tmp_path / "sync", ups, "sync", rng=rng, noise=noise)
    stream = write_run(tmp_path / "stream", ups, "stream", rng=rng, noise=noise)
    return sync, stream


def test_noise_free_trace_predicts_the_stream_run_exactly(tmp_path: Path) -> None:
    sync, stream = _pair(tmp_path, 0, 0.0)
    res = check(predict(load_trace(sync)), load_trace(stream))
    assert res["rel_error"] == pytest.approx(0.0, abs=1e-5)  # unix-time rounding only
    assert res["paired_updates"] == 5


@pytest.mark.parametrize("make", [grpo_update, opd_update])
def test_prediction_from_a_noisy_sync_run_is_within_five_percent(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    sync, stream = _pair(tmp_path, 1, 0.05, make)
    res = check(predict(load_trace(sync)), load_trace(stream))
    assert res["rel_error"] <= 0.05


def test_load_trace_recovers_the_simulated_workload(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    u = grpo_update(rng, groups=4, m=4)
    write_run(tmp_path, [u], "sync")
    (tu,) = load_trace(tmp_path / "spans.jsonl")
    assert pytest.approx(u.rollout_close) == tu.R
    assert simulate(tu.workload, "stream").step_s == pytest.approx(simulate(u, "stream").step_s)
    assert simulate(tu.workload, "group").step_s == pytest.approx(simulate(u, "group").step_s)


def test_update_time_given_as_start_is_accepted(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    u = grpo_update(rng, groups=2, m=4)
    write_run(tmp_path, [u], "sync")
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lines[0]["time"] -= lines[0]["step_s"]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (p,) = predict(load_trace(tmp_path))
    assert p.stream_step_s == pytest.approx(simulate(u, "stream").step_s)


def test_missing_metrics_and_missing_sync_updates_are_explained(tmp_path: Path) -> None:
    (tmp_path / "spans.jsonl").write_text("")
    with pytest.raises(TraceError, match="metrics.jsonl"):
        load_trace(tmp_path)
    rng = np.random.default_rng(5)
    stream = write_run(tmp_path / "s", [grpo_update(rng)], "stream")
    with pytest.raises(TraceError, match="no sync updates"):
        predict(load_trace(stream))


def test_predict_cli_checks_against_a_stream_run(tmp_path: Path) -> None:
    sync, stream = _pair(tmp_path, 6, 0.02)
    res = CliRunner().invoke(app, ["predict", str(sync), "--against", str(stream), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["predicted_speedup"] > 1.0
    assert out["check"]["rel_error"] <= 0.05
    assert summary(predict(load_trace(sync)))["replay_sync_rel_error"] < 0.05


def test_predict_cli_explains_a_bad_path(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["predict", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert "run directory" in res.output


def test_contention_stretches_the_prediction_and_is_reported_against_a_stream_run(
    tmp_path: Path,
) -> None:
    """A stream run whose rollout and overlapped learner items ran 20% / 50% slower than sync's
    is predicted exactly once that contention is given, and `check` measures it from the runs."""
    from thundersync.bench.predict import Contention
    from thundersync.bench.simulator import SimSchedule

    rng = np.random.default_rng(3)
    ups = [grpo_update(rng, rho=1.0, ranks=1) for _ in range(3)]
    c = Contention(rollout=1.2, learner=1.5)
    sync = write_run(tmp_path / "sync", ups, "sync", rng=rng, noise=0.0)
    stream = write_run(tmp_path / "stream", [c.apply(u) for u in ups], "stream", rng=rng, noise=0.0)
    plain = check(predict(load_trace(sync)), load_trace(stream), load_trace(sync))
    fitted = check(predict(load_trace(sync), c), load_trace(stream))
    assert plain["rel_error"] > 0.05  # the release model alone misses it
    assert fitted["rel_error"] <= 0.01  # (trace timestamps are rounded)
    assert plain["contention_rollout"] == pytest.approx(1.2, rel=1e-3)
    assert plain["contention_learner"] > 1.0
    assert simulate(Contention().apply(ups[0]), SimSchedule.STREAM) == simulate(
        ups[0], SimSchedule.STREAM
    )


def test_the_run_error_is_of_the_mean_step_and_single_updates_report_their_noise(
    tmp_path: Path,
) -> None:
    """A stream run whose updates ran alternately 10% slower and faster than the workload
    (machine noise): its mean step is predicted, single updates are not, and both are reported."""
    from thundersync.bench.predict import Contention

    rng = np.random.default_rng(8)
    ups = [grpo_update(rng, rho=1.0, ranks=1) for _ in range(4)]
    jittered = [Contention(f, f).apply(u) for u, f in zip(ups, [1.1, 0.9, 1.1, 0.9], strict=True)]
    sync = write_run(tmp_path / "sync", ups, "sync", rng=rng, noise=0.0)
    stream = write_run(tmp_path / "stream", jittered, "stream", rng=rng, noise=0.0)
    res = check(predict(load_trace(sync)), load_trace(stream))
    assert res["rel_error_per_update"] > 0.05
    assert res["rel_error"] < 0.02
