"""The streaming engine computes the batch-synchronous update, whatever the schedule or order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from thundersync.config import Schedule, load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.barrier import BarrierError
from thundersync.learner.batch_replay import LoggedBatch, replay_sources, replay_update
from thundersync.learner.reference import reference_loss
from thundersync.learner.sources import GrpoContent, GrpoReward
from thundersync.learner.trainer import Learner


def _cfg(objective: str = "grpo", **learner: object) -> object:
    return load_run_config(
        data={"objective": objective, "optim": {"max_grad_norm": 1e9}, "learner": learner}
    )


def _reference_grad(model_dir: Path, batch: LoggedBatch, **kw: object) -> torch.Tensor:
    model = load_model(model_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    gs = torch.autograd.grad(reference_loss(model, batch, **kw), params)  # type: ignore[arg-type]
    return torch.cat([g.reshape(-1) for g in gs]).double()


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_stream_gradient_matches_full_backward_reference(
    tiny_model_dir: Path, grpo_batch: LoggedBatch, estimator: str
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg(estimator=estimator))
    stats = replay_update(learner, grpo_batch, Schedule.STREAM)
    ref = _reference_grad(tiny_model_dir, grpo_batch, estimator=estimator)
    assert float((stats.grad.double() - ref).norm() / ref.norm()) < 1e-5


def test_opd_gradient_matches_full_backward_reference(
    tiny_model_dir: Path, opd_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg("opd"))
    stats = replay_update(learner, opd_batch, Schedule.STREAM)
    ref = _reference_grad(tiny_model_dir, opd_batch)
    assert float((stats.grad.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_sync_group_stream_give_bitwise_identical_parameters(
    tiny_model_dir: Path, grpo_batch: LoggedBatch, opd_batch: LoggedBatch, objective: str
) -> None:
    batch = grpo_batch if objective == "grpo" else opd_batch
    params = []
    for sched in (Schedule.SYNC, Schedule.GROUP, Schedule.STREAM):
        learner = Learner(load_model(tiny_model_dir), _cfg(objective, max_open_groups=2))
        replay_update(learner, batch, sched)
        params.append(learner.flat_params())
    assert torch.equal(params[0], params[1]) and torch.equal(params[0], params[2])


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_arrival_order_does_not_change_the_update(
    tiny_model_dir: Path, grpo_batch: LoggedBatch, opd_batch: LoggedBatch, objective: str
) -> None:
    batch = grpo_batch if objective == "grpo" else opd_batch
    grads = []
    for b in (batch, batch.shuffled(7), batch.shuffled(8)):
        learner = Learner(load_model(tiny_model_dir), _cfg(objective))
        grads.append(replay_update(learner, b, Schedule.STREAM).grad.double())
    for g in grads[1:]:
        assert float((g - grads[0]).norm() / grads[0].norm()) < 1e-6


def test_step_with_an_open_group_is_refused_and_nothing_moves(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg())
    before = learner.flat_params()
    engine = learner.open_update(Schedule.STREAM)
    for g in grpo_batch.groups:
        engine.register_group(g)
    g0 = grpo_batch.groups[0].group_id
    for ready, item in grpo_batch.events:
        if isinstance(item, GrpoContent | GrpoReward) and item.group_id == g0 and item.index == 0:
            continue  # trajectory 0 of group 0 never finishes (a failed rollout)
        engine.submit(item, ready)
        engine.drain()
    with pytest.raises(BarrierError, match=f"group {g0} open"):
        learner.step(engine)
    assert torch.equal(learner.flat_params(), before) and learner.version == 0


def test_opd_normalisation_by_n_k_is_deferred_to_the_barrier(
    tiny_model_dir: Path, opd_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg("opd"))
    engine = replay_sources(learner, opd_batch, Schedule.STREAM)
    unnormalised = engine.acc.grad.clone()  # the barrier normalises the buffer in place
    stats = learner.step(engine)
    n_k = (
        sum(sum(it.action_mask[1:]) for _, it in opd_batch.events if hasattr(it, "action_mask")) + 0
    )
    assert engine.acc.scored_tokens == n_k == stats.normaliser
    # the accumulator held the unnormalised ascent sum; the barrier divided by N_k once
    assert torch.allclose(unnormalised.double() / -n_k, stats.grad.double())
    ref = _reference_grad(tiny_model_dir, opd_batch)
    assert float((unnormalised.double() + n_k * ref).norm() / (n_k * ref).norm()) < 1e-5


def test_prompt_is_backpropagated_exactly_once_per_group(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg())
    replay_update(learner, grpo_batch, Schedule.STREAM)
    c = learner.last_engine.counters
    groups = len(grpo_batch.groups)
    assert c["prompt_forwards"] == groups and c["prompt_backwards"] == groups
    assert c["continuation_forwards"] == sum(g.size for g in grpo_batch.groups)


def test_earlier_opd_turns_are_not_rerun_per_turn(
    tiny_model_dir: Path, opd_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg("opd"))
    replay_update(learner, opd_batch, Schedule.STREAM)
    c = learner.last_engine.counters
    turns = sum(1 for _, it in opd_batch.events if hasattr(it, "teacher_logprobs"))
    assert c["turn_forwards"] == turns  # one forward per turn, none repeated
    tokens = sum(len(it.token_ids) for _, it in opd_batch.events if hasattr(it, "token_ids"))
    assert c["tokens_forward"] == tokens
    assert c["deferred_propagations"] > 0


def test_admission_cap_bounds_open_groups_and_late_rewards_bind(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg(max_open_groups=1))
    stats = replay_update(learner, grpo_batch, Schedule.STREAM)
    engine = learner.last_engine
    assert engine.peak_open == 1
    assert engine.counters["held_peak"] >= 1  # content arrived before its reward: held, then bound
    ref = _reference_grad(tiny_model_dir, grpo_batch)
    assert float((stats.grad.double() - ref).norm() / ref.norm()) < 1e-5


def test_lora_option_trains_adapters_through_the_same_engine(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    cfg = load_run_config(data={"model": {"lora_rank": 4}, "optim": {"max_grad_norm": 1e9}})
    learner = Learner(load_model(tiny_model_dir), cfg)
    assert learner.params and all("lora_" in n for n in learner.names)
    before = learner.flat_params()
    stats = replay_update(learner, grpo_batch, Schedule.STREAM)
    ref_model = Learner(load_model(tiny_model_dir), cfg).model
    params = [p for p in ref_model.parameters() if p.requires_grad]
    gs = torch.autograd.grad(reference_loss(ref_model, grpo_batch), params)
    ref = torch.cat([g.reshape(-1) for g in gs]).double()
    assert float((stats.grad.double() - ref).norm() / ref.norm()) < 1e-5
    assert not torch.equal(before, learner.flat_params())
