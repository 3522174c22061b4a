"""The streaming learner's update against SkyRL's own batch loss on the same batches.

SkyRL's side is its estimator, loss reduction and policy loss functions run as one rank of its
trainer runs them (`thundersync.skyrl.parity.skyrl_batch_loss`); ThunderSync's side is the
streaming engine fed source by source. In float64 (HF Llama patched to compute in float64) the
two gradients agree to rounding; `tsrl bench skyrl --json` reports the float32 numbers.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from thundersync.config import Objective, Schedule
from thundersync.hf_models import build_tiny_model, load_tokenizer
from thundersync.learner.batch_replay import make_grpo_batch, make_opd_batch, replay_update
from thundersync.learner.trainer import Learner
from thundersync.skyrl.parity import SkyRLAlgorithm, parity_config, skyrl_batch_loss


def _eager(model_dir: Path, dtype: torch.dtype) -> LlamaForCausalLM:
    model = LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation="eager"
    )
    model.eval()
    return model


@pytest.mark.parametrize(
    ("objective", "reduction"),
    [
        (Objective.GRPO, "sequence_mean"),
        (Objective.GRPO, "token_mean"),  # SkyRL's default
        (Objective.OPD, None),
    ],
)
def test_streamed_gradient_equals_skyrl_batch_gradient_in_float64(
    tmp_path: Path, true_float64: None, objective: Objective, reduction: str | None
) -> None:
    student = build_tiny_model(tmp_path / "s", seed=0)
    teacher = build_tiny_model(tmp_path / "t", seed=1, tokenizer=load_tokenizer(student))
    rng = random.Random(5)
    if objective is Objective.GRPO:  # unequal lengths, masked tool tokens, rewards far from 0
        batch = make_grpo_batch(rng, vocab=512, groups=3, group_size=4, reward_offset=3.0)
    else:
        batch = make_opd_batch(rng, _eager(teacher, torch.float64), vocab=512, trajectories=3)
    algo = SkyRLAlgorithm.for_objective(objective, "importance_sampling", reduction)
    model = _eager(student, torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    theirs = torch.cat(
        [g.reshape(-1) for g in torch.autograd.grad(skyrl_batch_loss(model, batch, algo), params)]
    )
    learner = Learner(_eager(student, torch.float64), parity_config(objective, "float64", algo))
    ours = replay_update(learner, batch.shuffled(9), Schedule.STREAM).grad
    assert ours.dtype == theirs.dtype == torch.float64
    err = float((ours - theirs).norm() / theirs.norm())
    assert err < 1e-12, err


def test_bench_skyrl_reports_parity_in_one_json_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "bench", "skyrl", "--updates", "2"]
        + ["--loop-rounds", "1", "--loop-steps", "2", "--loop-width", "64", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["skyrl_version"] == "0.4.0"
    for key in ("grpo", "grpo_token_mean", "opd"):
        r = res[key]
        assert len(r["grad_rel_err"]) == 2
        assert r["parity_grad_rel_err"] <= 1e-6, r
        assert r["parity_param_gap"] < 1e-3, r
    assert res["grpo"]["learner_estimator"] == "grpo_sample_std"
    assert res["grpo_token_mean"]["skyrl_algorithm"]["loss_reduction"] == "token_mean"
    # SkyRL's own loop: the streaming learner's update equals SkyRL's, and the timed rounds ran
    loop = res["loop"]
    assert loop["parity"]["parity_grad_rel_err"] <= 1e-6, loop["parity"]
    assert loop["parity_opd"]["parity_grad_rel_err"] <= 2e-6, loop["parity_opd"]  # test_loop.py
    assert res["efficiency"] == pytest.approx(loop["speedup_vs_skyrl_sync"] / loop["bound"])
    assert loop["bound"] >= 1.0 and loop["skyrl_sync"]["R"] > 0 and loop["skyrl_sync"]["L"] > 0
    assert loop["skyrl_fully_async"]["max_staleness_steps"] == 1
    assert loop["skyrl_fully_async"]["staleness_mean"] > 0  # it did train on stale rollouts
