"""`rollout.on_failure`: a run whose sandbox fails (the fault plan's crashing environment) under
`drop` completes, and its update equals the textbook trainer of the equivalence bench (full
forwards, one backward, torch AdamW: no engine code) on the batch with the failed rows masked;
under `fail` it stops before any step. Real driver, learner process, agent loop and sandbox."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import torch

from thundersync.bench.equivalence import train_reference
from thundersync.config import ConfigError, RunConfig, load_run_config
from thundersync.driver.faults import FaultPlan
from thundersync.driver.replay_gap import load_logged_batch, replay_gap
from thundersync.driver.run import RunDriver, RunFailed
from thundersync.driver.tasks import PlannedTrajectory, plan_update, task_pool
from thundersync.learner.batch_replay import LoggedBatch
from thundersync.learner.sources import Dropped
from thundersync.rollout.checkpoint import load_state_dict
from thundersync.rundir import RunFiles
from thundersync.service.launcher.ingest import _update_row
from thundersync.service.schemas import UpdatePublic
from thundersync.service.tables import Run

CRASH = "RuntimeError: injected rollout worker crash"

# HF Llama runs RMSNorm and its RoPE tables in fp32 even for a float64 model (DESIGN.md: fp64
# checks stall at ~1e-7); tests/hf_float64.py computes them in the input dtype. The test installs
# it in its own process and, through a sitecustomize on PYTHONPATH, in the spawned learner process.
SITECUSTOMIZE = f"""
import sys
sys.path.append({str(Path(__file__).resolve().parents[1])!r})
try:
    import hf_float64
except ImportError:  # a process without transformers (e.g. inside a sandbox)
    pass
else:
    hf_float64.install_in_dtype()
"""


@pytest.fixture
def true_float64(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_float64 import patch_llama_in_dtype

    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    old = [x for x in [os.environ.get("PYTHONPATH")] if x]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *old]))
    patch_llama_in_dtype(monkeypatch)


def _cfg(recipe: str, **over: object) -> RunConfig:
    base: dict[str, object] = {
        "updates": 1,
        "rollout.groups_per_update": 2,
        "rollout.group_size": 4,
        "model.dtype": "float64",  # so that the comparison with the textbook trainer is exact
        "learner.accum_dtype": "float64",
        "rollout.on_failure": "drop",
    }
    return load_run_config(recipe, base | over)


def _plans(cfg: RunConfig) -> list[PlannedTrajectory]:
    return plan_update(cfg, task_pool(cfg), 0)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _gap_to_textbook(run_dir: Path, cfg: RunConfig, batch: LoggedBatch) -> float:
    """max |theta_1(run) - theta_1(textbook on the logged, masked batch)| / max |step|.

    Measured: 4.7e-12 (GRPO) and 2.0e-10 (OPD) of a step. AdamW's first step is lr * g / (|g| +
    eps): in coordinates with |g| below eps = 1e-8 an absolute gradient difference d moves the
    parameter by lr * d / eps, so 1e-10 of a step is d ~ 1e-18, float64 round-off; a wrong mask
    (a dropped row kept, a group of 1 kept, 1/m over the configured size) is O(1) of a step."""
    files = RunFiles(run_dir)
    ref = train_reference(run_dir / "model", cfg, [batch.masked()], dtype=torch.float64)
    ran = load_state_dict(files.weights(1))
    names = [n for n, _ in _named(run_dir / "model")]
    got = torch.cat([ran[n].reshape(-1).double() for n in names])
    step = float((ref["params"][1] - ref["params"][0]).abs().max())
    assert step > 0
    return float((got - ref["params"][1]).abs().max()) / step


def _named(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    from thundersync.hf_models import load_model

    return [(n, p) for n, p in load_model(model_dir).named_parameters() if p.requires_grad]


def test_bad_failure_policy_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.on_failure: .*'rerun', 'drop' or 'fail'"):
        load_run_config("grpo-toy", {"rollout.on_failure": "skip"})
    with pytest.raises(ConfigError, match=r"rollout\.max_tries=3 with rollout\.on_failure=fail"):
        load_run_config("grpo-toy", {"rollout.on_failure": "fail", "rollout.max_tries": 3})
    cfg = load_run_config("grpo-toy", {"rollout.on_failure": "drop"})
    assert cfg.rollout.tries == 1 and load_run_config("grpo-toy").rollout.tries == 4


def test_grpo_drop_completes_and_equals_masked_textbook_update(
    tmp_path: Path, true_float64: None
) -> None:
    """Group 0 loses 3 of its 4 members (below the minimum of 2: dropped whole, including the
    member it had applied), group 1 loses one (closes over 3)."""
    cfg = _cfg("grpo-toy")
    plans = _plans(cfg)
    g0 = [p.traj_id for p in plans if p.group_id == plans[0].group_id]
    g1 = [p.traj_id for p in plans if p.group_id != plans[0].group_id]
    victims = {*g0[1:], g1[2]}
    faults = FaultPlan(crash_once=set(victims))  # a copy: the plan empties its set
    assert RunDriver(cfg, tmp_path, log_batches=True, faults=faults).run() == 0
    rec = _metrics(tmp_path)[0]
    assert rec["dropped_trajectories"] == 4 and rec["dropped_groups"] == 1
    assert rec["drop_reasons"] == {CRASH: 4}
    # the service ingests the line and its updates API serves the counts as typed fields
    row = UpdatePublic.model_validate(_update_row(Run(id=uuid.uuid4(), schedule="stream"), rec))
    assert (row.dropped_trajectories, row.dropped_groups) == (4, 1)
    assert row.drop_reasons == {CRASH: 4}
    log = (tmp_path / "log.txt").read_text()
    assert f"group {plans[0].group_id} dropped whole" in log and "keeps 3 of 4" in log
    assert "rerun" not in log
    batch = load_logged_batch(RunFiles(tmp_path).batch_logs()[0], cfg)
    assert [(g.group_id, g.size) for g in batch.groups] == [(plans[-1].group_id, 3)]
    applied = {it.source_id.removesuffix("/reward") for _, it in batch.events}
    assert applied == set(g1) - victims
    gap = _gap_to_textbook(tmp_path, cfg, batch)
    assert gap <= 1e-8, f"theta_1 differs from the masked textbook update by {gap:.2e} of a step"
    # the batch log is the masked batch: `tsrl replay-gap` replays it through sync unchanged
    # (it loads the model in float32 whatever model.dtype says: 2e-5 here, a float32 replay)
    assert max(replay_gap(tmp_path, cfg, tmp_path / "model")) <= 1e-4
    # the control: one more row masked is visibly another update (the check can fail)
    more = Dropped("control", plans[-1].group_id, 0)
    wrong = LoggedBatch(batch.objective, batch.groups, [], [*batch.events, (0.0, more)])
    assert _gap_to_textbook(tmp_path, cfg, wrong) > 1e-2


def test_opd_drop_removes_the_sent_turns_and_equals_masked_textbook_update(
    tmp_path: Path, true_float64: None
) -> None:
    cfg = _cfg("opd-toy")
    victim = _plans(cfg)[1].traj_id  # crashes at its second tool call: turn 0 already sent
    assert (
        RunDriver(cfg, tmp_path, log_batches=True, faults=FaultPlan(crash_once={victim})).run() == 0
    )
    rec = _metrics(tmp_path)[0]
    assert rec["dropped_trajectories"] == 1 and rec["dropped_groups"] == 0
    assert f"trajectory {victim} dropped ({CRASH})" in (tmp_path / "log.txt").read_text()
    batch = load_logged_batch(RunFiles(tmp_path).batch_logs()[0], cfg)
    assert victim not in batch.trajectories and len(batch.trajectories) == 7
    gap = _gap_to_textbook(tmp_path, cfg, batch)
    assert gap <= 1e-8, f"theta_1 differs from the masked textbook update by {gap:.2e} of a step"


def test_fail_policy_stops_before_any_step(tmp_path: Path) -> None:
    cfg = _cfg("grpo-toy", **{"rollout.on_failure": "fail"})
    victim = _plans(cfg)[2].traj_id
    with pytest.raises(RunFailed, match="rollout.on_failure=fail"):
        RunDriver(cfg, tmp_path, faults=FaultPlan(crash_once={victim})).run()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "failed" and victim in status["reason"]
    assert not (tmp_path / "metrics.jsonl").exists() or not _metrics(tmp_path)
    assert not RunFiles(tmp_path).weights(1).exists()


def test_drop_reruns_while_tries_are_left(tmp_path: Path) -> None:
    """`drop` with `max_tries: 2`: the crashed trajectory's second attempt (same theta_k, new
    id) succeeds, so nothing is dropped."""
    cfg = _cfg("grpo-toy", **{"rollout.max_tries": 2, "model.dtype": "float32"})
    victim = _plans(cfg)[5].traj_id
    assert RunDriver(cfg, tmp_path, faults=FaultPlan(crash_once={victim})).run() == 0
    assert f"trajectory {victim} failed" in (tmp_path / "log.txt").read_text()
    rec = _metrics(tmp_path)[0]
    assert rec["dropped_trajectories"] == 0 and "drop_reasons" not in rec
