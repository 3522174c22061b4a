"""Precision and placement of the learner: bf16 compute with fp32 master weights, the dtypes of
accumulators and ledgers, the GRPO statistics on shifted rewards, the group reduction, devices."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from thundersync.config import RunConfig, Schedule, load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.batch_replay import LoggedBatch, make_grpo_batch, replay_update
from thundersync.learner.boundary import run_segment
from thundersync.learner.checkpoint import load_checkpoint, save_checkpoint
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward, OpdTurn
from thundersync.learner.trainer import Learner


def _cfg(objective: str = "grpo", **learner: object) -> RunConfig:
    return load_run_config(
        data={"objective": objective, "optim": {"max_grad_norm": 1e9}, "learner": learner}
    )


def _equal_reward_group(gid: str, reward: float, m: int = 3) -> LoggedBatch:
    b = LoggedBatch(load_run_config(data={}).objective)
    b.groups.append(GrpoGroupSpec(gid, (11, 12, 13, 14), m))
    for i in range(m):
        resp = tuple(20 + i + j for j in range(5))
        b.events.append((float(i), GrpoContent(f"{gid}/t{i}", gid, i, resp, (1,) * 5)))
        b.events.append((i + 0.5, GrpoReward(f"{gid}/r{i}", gid, i, reward)))
    return b


def test_equal_rewards_far_from_zero_give_exactly_zero_gradient(tiny_model_dir: Path) -> None:
    # m = 3 (not a power of two) at 1e6 + 0.3: on raw rewards mean - c is an ulp, /eps -> 1e-4
    learner = Learner(load_model(tiny_model_dir), _cfg())
    stats = replay_update(learner, _equal_reward_group("g", 1e6 + 0.3), Schedule.STREAM)
    assert stats.grad.abs().max().item() == 0.0


def test_sum_reduction_adds_group_directions_and_mean_divides(tiny_model_dir: Path) -> None:
    batch = make_grpo_batch(random.Random(3), vocab=512, groups=3, group_size=4)
    grads = {}
    for red in ("sum", "mean"):
        learner = Learner(load_model(tiny_model_dir), _cfg(group_reduction=red))
        stats = replay_update(learner, batch, Schedule.STREAM)
        grads[red] = stats.grad.double()
        assert stats.normaliser == (1.0 if red == "sum" else 3.0)
    assert torch.allclose(grads["sum"], 3 * grads["mean"], rtol=1e-6, atol=0)


def test_opd_trajectory_sums_honour_accum_dtype(tiny_model_dir: Path) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg("opd", accum_dtype="float64"))
    engine = learner.open_update(Schedule.STREAM)
    engine.register_trajectory("o0")
    tokens = (5, 9, 17, 33, 40)
    engine.submit(OpdTurn("o0/t0", "o0", 0, tokens, (0, 0, 1, 1, 1), (-1.0, -2.0, -3.0)), 0.0)
    engine.drain()
    assert engine.opd.trajs["o0"].acc.flat.dtype == torch.float64


def test_bf16_compute_steps_fp32_master_weights_and_moments(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = load_model(tiny_model_dir, dtype=torch.bfloat16)
    learner = Learner(model, _cfg())
    assert learner.compute_dtype == torch.bfloat16 and learner.master_dtype == torch.float32
    batch = make_grpo_batch(random.Random(1), vocab=512, groups=2, group_size=4)
    replay_update(learner, batch, Schedule.STREAM)
    opt = learner.optimizer.opt  # type: ignore[attr-defined]
    moments = [s["exp_avg"] for s in opt.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    for p, m in zip(learner.params, learner.optimizer.master, strict=True):
        assert m.dtype == torch.float32 and torch.equal(p, m.to(torch.bfloat16))
    # lr 1e-3 on weights ~0.05: bf16 alone would round many updates away, the master keeps them
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in learner.optimizer.master)
    # a checkpoint keeps the fp32 master, not its bf16 rounding
    save_checkpoint(learner, tmp_path)
    resumed = Learner(load_model(tiny_model_dir, dtype=torch.bfloat16), _cfg())
    load_checkpoint(resumed, tmp_path)
    assert torch.equal(resumed.flat_params(), learner.flat_params())


def test_bf16_model_gives_fp32_logits_and_fp32_opd_ledgers(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, dtype=torch.bfloat16)
    ids = torch.tensor([5, 9, 17])
    out = run_segment(model, ids, past=[], start=0)
    lp = scored_logprobs(model, out.hidden, ids, torch.tensor([True, True]))
    assert lp.dtype == torch.float32 and out.hidden.dtype == torch.bfloat16
    assert out.kv[0][0].dtype == torch.bfloat16
    learner = Learner(model, _cfg("opd"))
    engine = learner.open_update(Schedule.STREAM)
    engine.register_trajectory("o0")
    engine.submit(OpdTurn("o0/t0", "o0", 0, (5, 9, 17, 33), (0, 0, 1, 1), (-1.0, -2.0)), 0.0)
    engine.drain()
    assert all(a.dtype == torch.float32 for a in engine.opd.trajs["o0"].ledger[0])


def test_learner_device_auto_is_cpu_here_and_cuda_without_a_gpu_is_refused(
    tiny_model_dir: Path,
) -> None:
    learner = Learner(load_model(tiny_model_dir), _cfg(device="auto"))
    assert learner.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="learner.device is cuda"):
            Learner(load_model(tiny_model_dir), _cfg(device="cuda"))


def test_bf16_run_trains_end_to_end_and_publishes_bf16_weights(tmp_path: Path) -> None:
    from thundersync.driver.run import RunDriver
    from thundersync.rollout.checkpoint import load_state_dict
    from thundersync.rundir import RunFiles

    cfg = load_run_config(
        "grpo-toy",
        {"updates": 2, "rollout.groups_per_update": 1, "model.dtype": "bfloat16"},
    )
    assert RunDriver(cfg, tmp_path).run() == 0
    published = load_state_dict(RunFiles(tmp_path).weights(2))
    assert {t.dtype for t in published.values()} == {torch.bfloat16}
