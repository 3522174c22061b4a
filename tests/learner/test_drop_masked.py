"""A dropped trajectory (`rollout.on_failure: drop`) leaves the update equal to sync training on
the batch with that row masked, checked against the independent float64 textbook reference
(tests/learner/f64_reference.py: a plain-torch forward and the DESIGN.md losses, no engine code).

GRPO: a group closes over its other members (statistics and 1/m over them only); a group left
below the estimator's minimum is dropped whole, with the sources it had already applied. OPD: a
dropped trajectory's turns already applied are removed, and N_k counts only the others' tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from f64_reference import reference_grad
from test_float64_reference import (  # the fixtures and hand-built batches of the f64 suite
    REL_TOL,
    Group,
    Traj,
    _config,
    _hf_model,
    grpo_batch,
    model_dir,  # noqa: F401  (a fixture)
    opd_batch,
)

from thundersync.config import Schedule
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.engine_core import SourceError
from thundersync.learner.sources import Dropped, GrpoContent, GrpoGroupSpec, GrpoReward
from thundersync.learner.trainer import Learner

GROUPS = [
    Group(5, (Traj(5, 1.0, (1,)), Traj(3, 0.2), Traj(7, -0.4), Traj(4, 0.9))),  # loses member 1
    Group(3, (Traj(4, 1e6 + 1.0), Traj(6, 1e6 - 0.5), Traj(3, 1e6 + 0.25))),  # intact
    Group(4, (Traj(4, 0.0), Traj(5, 1.0))),  # loses member 0: below 2, dropped whole
]


def _grad(path: Path, cfg: object, batch: LoggedBatch, schedule: Schedule) -> tuple:
    learner = Learner(_hf_model(path, torch.float64), cfg)  # type: ignore[arg-type]
    stats = replay_update(learner, batch, schedule)
    return stats.grad.clone(), list(learner.names), learner.last_engine.counters


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize(
    ("estimator", "reduction", "schedule"),
    [
        ("grpo", "sum", "stream"),
        ("grpo", "mean", "stream"),
        ("grpo", "mean", "group"),
        ("grpo", "mean", "sync"),
        ("dr_grpo", "mean", "stream"),
        ("rloo", "sum", "stream"),
    ],
)
def test_grpo_drop_equals_masked_sync_textbook(
    model_dir: Path,  # noqa: F811
    true_float64: None,
    estimator: str,
    reduction: str,
    schedule: str,
) -> None:
    clean = grpo_batch(GROUPS, seed=3)
    batch = clean.with_drops([("g0", 1), ("g2", 0)], at=11.0)
    cfg = _config("grpo", estimator=estimator, group_reduction=reduction)
    got, names, counters = _grad(model_dir, cfg, batch, Schedule(schedule))
    assert counters["dropped_trajectories"] == 2 and counters["dropped_groups"] == 1
    masked = batch.masked()
    assert [(g.group_id, g.size) for g in masked.groups] == [("g0", 3), ("g1", 3)]
    ref = reference_grad(
        model_dir,
        masked,
        names,
        objective="grpo",
        estimator=estimator,
        eps=cfg.learner.std_eps,
        token_weighting=cfg.learner.token_weighting,
        group_reduction=reduction,
    )
    err = _rel(got, ref)
    assert err <= REL_TOL, f"relative error {err:.3e} against the masked textbook update"
    # and the engine replaying the masked batch itself (no drops) gives the very same bits
    plain, _, _ = _grad(model_dir, cfg, masked, Schedule.SYNC)
    assert torch.equal(got, plain)


def test_opd_drop_equals_masked_sync_textbook(
    model_dir: Path,  # noqa: F811
    true_float64: None,
) -> None:
    clean = opd_batch([[(5, 4), (2, 3), (3, 5)], [(4, 2), (1, 4), (2, 2)], [(6, 3), (2, 4)]], 7)
    o1_turns = [t for t, it in clean.events if getattr(it, "traj_id", "") == "o1"]
    after = sorted(o1_turns)[1] + 1e-3  # after its second turn was applied
    batch = clean.with_drops([("o1", None)], at=after)
    got, names, counters = _grad(model_dir, _config("opd"), batch, Schedule.STREAM)
    assert counters["dropped_trajectories"] == 1
    masked = batch.masked()
    assert masked.trajectories == ["o0", "o2"]
    ref = reference_grad(model_dir, masked, names, objective="opd")
    err = _rel(got, ref)
    assert err <= REL_TOL, f"relative error {err:.3e} against the masked textbook update"


def test_drop_of_an_applied_member_or_unknown_group_is_refused(model_dir: Path) -> None:  # noqa: F811
    learner = Learner(_hf_model(model_dir, torch.float64), _config("grpo"))
    eng = learner.open_update(Schedule.STREAM)
    eng.register_group(GrpoGroupSpec("g", (9, 10, 11), 3))
    eng.submit(GrpoReward("g/r0", "g", 0, 1.0), 0.0)
    eng.drain()
    with pytest.raises(SourceError, match="already applied"):
        eng.drop(Dropped("g/0/dropped", "g", 0))
    with pytest.raises(SourceError, match="not registered"):
        eng.drop(Dropped("h/0/dropped", "h", 0))
    eng.drop(Dropped("g/1/dropped", "g", 1))  # g keeps 2 of 3: still open, waiting for member 2
    assert eng.grpo.specs["g"].size == 2 and eng.counters["dropped_groups"] == 0
    eng.drop(Dropped("g/2/dropped", "g", 2))  # 1 of 3 left: below 2, dropped whole
    assert "g" in eng.dropped and not eng.grpo.groups and eng.counters["dropped_groups"] == 1
    eng.submit(GrpoContent("g/t0", "g", 0, (12, 13), (1, 1)), 1.0)  # a straggler: ignored
    assert eng.counters["dropped_late_sources"] == 1 and not eng.open_sources()
