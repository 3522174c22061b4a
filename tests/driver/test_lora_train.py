"""LoRA end to end: `tsrl train` with model.lora_rank > 0, merged weights served by the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.config import RunConfig, Schedule, load_run_config
from thundersync.driver.replay_gap import load_logged_batch, replay_gap
from thundersync.driver.run import RunDriver
from thundersync.hf_models import load_model
from thundersync.learner.batch_replay import replay_update
from thundersync.learner.lora import adapted_names
from thundersync.learner.trainer import Learner
from thundersync.rollout.checkpoint import load_state_dict
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.types import SamplingParams
from thundersync.rundir import RunFiles

SMALL = {"rollout.groups_per_update": 2, "rollout.group_size": 4, "model.lora_rank": 4}
PROMPT = [1, 10, 11, 12, 13]


def _logprobs(model: torch.nn.Module, tokens: list[int]) -> list[float]:
    """log pi(token | prefix) of every generated token, by one full forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + tokens])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


def _engine_serves_the_learner(run_dir: Path, cfg: RunConfig) -> None:
    """After each publish, the engine loaded from the version's checkpoint samples with the
    log-probs of the learner's own (unmerged peft) model at that version: a sync replay."""
    files, model_dir = RunFiles(run_dir), run_dir / "model"
    base = load_model(model_dir).state_dict()
    learner = Learner(load_model(model_dir), cfg)
    engine = HFEngine(model_dir)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    g0 = engine.generate(PROMPT, sampling, seed=0)
    for version, paths in enumerate(files.batch_logs().values(), start=1):
        replay_update(learner, load_logged_batch(paths, cfg), Schedule.SYNC)
        published = load_state_dict(files.weights(version))
        assert sorted(published) == sorted(base)  # base names, no peft prefixes or adapters
        engine.load_weights(version, files.weights(version))
        g = engine.generate(PROMPT, sampling, seed=version, version=version)
        got, want = g.logprobs, _logprobs(learner.model, g.token_ids)
        assert max(abs(x - y) for x, y in zip(got, want, strict=True)) < 1e-4, version
    assert learner.version == cfg.updates
    # the adapters moved the served policy (else the comparison above proves nothing)
    assert any(not torch.equal(published[n], base[n]) for n in adapted_names(learner.model))
    moved = _logprobs(engine.model, g0.token_ids)
    assert max(abs(x - y) for x, y in zip(moved, g0.logprobs, strict=True)) > 1e-4


def test_tsrl_train_with_lora_publishes_loadable_weights(tmp_path: Path) -> None:
    sets = [f"{k}={v}" for k, v in (SMALL | {"updates": 3}).items()]
    args = ["train", "grpo-toy", "--run-dir", str(tmp_path), "--quiet"]
    res = CliRunner().invoke(app, args + [x for s in sets for x in ("--set", s)])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "succeeded"
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    # every version was loaded and acked by the engine (else the run fails); the last is on disk
    base = load_model(tmp_path / "model").state_dict()
    published = load_state_dict(RunFiles(tmp_path).weights(3))
    assert sorted(published) == sorted(base)  # safetensors stores keys sorted
    assert all(
        published[k].shape == v.shape and published[k].dtype == v.dtype for k, v in base.items()
    )


@pytest.mark.parametrize(
    ("recipe", "updates", "extra"),
    [
        ("grpo-toy", 3, {}),
        ("opd-toy", 2, {}),
        # the paper's setting: every linear layer, alpha = 2 r
        ("grpo-toy", 2, {"model.lora_targets": ["all-linear"], "model.lora_alpha": 8.0}),
    ],
)
def test_lora_run_engine_matches_learner_and_equals_sync(
    tmp_path: Path, recipe: str, updates: int, extra: dict[str, object]
) -> None:
    cfg = load_run_config(recipe, SMALL | {"updates": updates} | extra)
    assert RunDriver(cfg, tmp_path, log_batches=True).run() == 0
    gaps = replay_gap(tmp_path, cfg, tmp_path / "model")  # on the merged adapted weights
    assert len(gaps) == updates and max(gaps) <= 1e-6, gaps
    _engine_serves_the_learner(tmp_path, cfg)
