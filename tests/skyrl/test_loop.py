"""SkyRL's own trainer loop (`RayPPOTrainer.train()`) on CPU with ThunderSync's streaming learner:
each update equals SkyRL's batch-synchronous update of the same batch at the same weights, the
switch runs it from SkyRL's entry point, what the CPU loop cannot run is refused by SkyRL field,
and a trajectory that cannot be applied leaves the weights untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from skyrl.train.config import SkyRLTrainConfig

from thundersync.config import load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.trainer import Learner
from thundersync.skyrl.cpu_workers import StreamingWorker
from thundersync.skyrl.loop_bench import LoopWorkload, parity
from thundersync.skyrl.switch import SkyRLConfigError
from thundersync.skyrl.trainers import check_cpu_loop


def test_streaming_loop_update_equals_skyrl_sync_update() -> None:
    r = parity(LoopWorkload(prompts=2, group_size=3, max_tokens=6, steps=2))
    assert r["updates"] == 2
    # fp32; the only arithmetic difference is SkyRL's padded batch forward vs per-source passes
    assert r["parity_grad_rel_err"] <= 1e-6, r
    assert r["parity_param_gap"] < 1e-3, r  # each side trained on its own for 2 updates


def test_streaming_opd_turns_equal_skyrl_distillation_update() -> None:
    """OPD: each turn scored by the teacher as the engine serves it (tools still to run), the
    trajectory closed when SkyRL's agent loop returns, against SkyRL's distillation recipe (its
    reference model as teacher, rewards log pi_T - log pi) on the same batch and weights."""
    w = LoopWorkload(objective="opd", prompts=2, group_size=2, max_tokens=6, steps=2, tool_turns=2)
    r = parity(w)
    assert r["updates"] == 2
    # 8 trajectories of 2-3 turns each (1-2 tool calls), every turn its own source
    assert r["streamed_trajectories"] == 8 and r["streamed_turns"] >= 16, r
    # fp32: the advantage log pi_T - log pi cancels two ~-10 log-probs, and SkyRL's loop keeps
    # the reference log-probs in float32 (a float64 run still differs by ~4e-7): ~1e-6 is the floor
    assert r["parity_grad_rel_err"] <= 2e-6, r
    assert r["parity_param_gap"] < 1e-3, r


def test_switch_runs_skyrl_main_with_the_streaming_loop(tmp_path: Path) -> None:
    args = LoopWorkload(prompts=2, group_size=2, max_tokens=4, steps=2).overrides(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.skyrl.loop"]
        + ["trainer.override_entrypoint=thundersync.skyrl.loop", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"loop": "stream", "steps": 2}
    assert "policy/streamed_trajectories" in out.stdout + out.stderr


def _cfg(**over: object) -> SkyRLTrainConfig:
    base = {
        "trainer.policy.model.path": "m",
        "generator.inference_engine.enable_ray_prometheus_stats": "false",
        "data.dataloader.num_workers": 0,
    }
    return SkyRLTrainConfig.from_cli_overrides([f"{k}={v}" for k, v in (base | over).items()])


@pytest.mark.parametrize(
    "field",
    [
        "generator.inference_engine.enable_ray_prometheus_stats",
        "generator.zero_reward_on_non_stop",
        "trainer.algorithm.use_kl_in_reward",
    ],
)
def test_what_the_cpu_loop_cannot_run_is_refused_by_field(field: str) -> None:
    check_cpu_loop(_cfg())
    with pytest.raises(SkyRLConfigError, match=field.split(".", 1)[1].replace(".", r"\.")):
        check_cpu_loop(_cfg(**{field: "true"}))


def test_a_trajectory_that_cannot_be_applied_takes_no_step(tiny_model_dir: Path) -> None:
    cfg = load_run_config(data={"optim": {"lr": 1e-2}, "learner": {"device": "cpu"}})
    learner = Learner(load_model(tiny_model_dir), cfg)
    before = learner.flat_params().clone()
    worker = StreamingWorker(learner, group_size=2)
    worker.open()
    good = SimpleNamespace(
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9],
        loss_mask=[1, 1],
        rollout_logprobs=None,
        reward=1.0,
    )
    worker.submit("p", 0, good)
    worker.submit("p", 1, SimpleNamespace(**{**vars(good), "loss_mask": [1], "reward": 0.0}))
    with pytest.raises(RuntimeError, match="no step taken"):
        worker.optim_step()
    assert torch.equal(learner.flat_params(), before)
