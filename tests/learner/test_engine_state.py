"""The engine's parts own their state: an aborted group or trajectory leaves no trace in the
update, a closed one cannot be aborted, and sources of unregistered owners are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from thundersync.config import Schedule, load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.engine import GradientEngine, SourceError
from thundersync.learner.sources import GrpoContent, GrpoReward, OpdClose, OpdTurn
from thundersync.learner.trainer import Learner


def _learner(model_dir: Path, objective: str = "grpo") -> Learner:
    cfg = load_run_config(data={"objective": objective, "optim": {"max_grad_norm": 1e9}})
    return Learner(load_model(model_dir), cfg)


def _without(batch: LoggedBatch, key: str) -> LoggedBatch:
    keep = [(t, it) for t, it in batch.events if it.key != key]
    groups = [g for g in batch.groups if g.group_id != key]
    trajs = [t for t in batch.trajectories if t != key]
    return LoggedBatch(batch.objective, groups, trajs, keep)


def _replay_aborting(engine: GradientEngine, batch: LoggedBatch, key: str) -> None:
    """Every source applied, but `key`'s stop half way and `key` is aborted then."""
    for g in batch.groups:
        engine.register_group(g)
    for t in batch.trajectories:
        engine.register_trajectory(t)
    mine = [it for _, it in batch.events if it.key == key]
    for ready, item in batch.events:
        if item.key == key and mine.index(item) == len(mine) // 2:
            # some of its work is applied already, held in its own sums
            assert engine.grpo.is_open(key) or engine.opd.is_open(key)
            engine.abort(key)
        if item.key == key and mine.index(item) >= len(mine) // 2:
            continue
        engine.submit(item, ready)
        engine.drain()
    engine.close_batch()
    engine.drain()


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_an_aborted_owner_leaves_the_update_bitwise_as_if_it_never_came(
    tiny_model_dir: Path, grpo_batch: LoggedBatch, opd_batch: LoggedBatch, objective: str
) -> None:
    batch = grpo_batch if objective == "grpo" else opd_batch
    key = batch.groups[0].group_id if batch.groups else batch.trajectories[0]
    aborted = _learner(tiny_model_dir, objective)
    engine = aborted.open_update(Schedule.STREAM)
    _replay_aborting(engine, batch, key)
    assert not engine.open_sources() and engine.counters["aborted"] == 1
    got = aborted.step(engine)
    want = replay_update(_learner(tiny_model_dir, objective), _without(batch, key), Schedule.STREAM)
    assert torch.equal(got.grad, want.grad)


def test_a_closed_group_cannot_be_aborted(tiny_model_dir: Path, grpo_batch: LoggedBatch) -> None:
    engine = _learner(tiny_model_dir).open_update(Schedule.STREAM)
    g0 = grpo_batch.groups[0]
    engine.register_group(g0)
    for ready, item in grpo_batch.events:
        if item.key == g0.group_id:
            engine.submit(item, ready)
            engine.drain()
    assert g0.group_id in engine.grpo.closed and not engine.grpo.groups
    with pytest.raises(SourceError, match="already closed"):
        engine.abort(g0.group_id)


def test_sources_of_unregistered_owners_are_refused(tiny_model_dir: Path) -> None:
    engine = _learner(tiny_model_dir).open_update(Schedule.STREAM)
    with pytest.raises(SourceError, match="not registered"):
        engine.submit(GrpoContent("g/t0", "g", 0, (9, 10), (1, 1)), 0.0)
    with pytest.raises(SourceError, match="not registered"):
        engine.submit(GrpoReward("g/r0", "g", 0, 1.0), 0.0)
    with pytest.raises(SourceError, match="not registered"):
        engine.submit(OpdTurn("o/t0", "o", 0, (9, 10), (0, 1), (-1.0,)), 0.0)
    with pytest.raises(SourceError, match="not registered"):
        engine.submit(OpdClose("o/close", "o", 1), 0.0)
