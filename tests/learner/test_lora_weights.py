"""A LoRA learner publishes merged weights under the base model's names (what engines load)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from thundersync.config import Schedule, load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.checkpoint import load_checkpoint, save_checkpoint
from thundersync.learner.lora import adapted_names, apply_lora, merged_state_dict
from thundersync.learner.trainer import Learner
from thundersync.rollout.hf_engine import HFEngine

RANK, ALPHA = 4, 16.0
IDS = torch.tensor([[1, 10, 11, 12, 13, 40, 41, 7, 300, 5]])


def _trained_lora(model_dir: Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A peft model whose B is non-zero (at init B = 0 and the merge would be trivial)."""
    peft = apply_lora(load_model(model_dir, dtype=dtype), RANK, ALPHA, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return peft


def _by_hand(peft: nn.Module) -> dict[str, torch.Tensor]:
    """W + (alpha/r) B @ A from the module's own tensors, plain torch."""
    state = peft.state_dict()
    out = {}
    for name in adapted_names(peft):
        stem = "base_model.model." + name.removesuffix(".weight")
        w = state[f"{stem}.base_layer.weight"]
        a, b = state[f"{stem}.lora_A.default.weight"], state[f"{stem}.lora_B.default.weight"]
        out[name] = w + (ALPHA / RANK) * (b @ a)
    return out


def test_merged_dict_equals_the_merge_by_hand_and_peft_merge(tiny_model_dir: Path) -> None:
    peft = _trained_lora(tiny_model_dir)
    live = {k: v.clone() for k, v in peft.state_dict().items()}
    merged = merged_state_dict(peft)

    base = load_model(tiny_model_dir).state_dict()
    assert list(merged) == list(base)
    assert all(merged[k].shape == base[k].shape and merged[k].dtype == base[k].dtype for k in base)
    names = adapted_names(peft)
    assert len(names) == 4 and all(("q_proj" in n) or ("v_proj" in n) for n in names)
    for name, want in _by_hand(peft).items():
        torch.testing.assert_close(merged[name], want, rtol=0, atol=1e-6)
        assert not torch.allclose(merged[name], base[name])  # the adapters did change it
    assert all(torch.equal(merged[k], base[k]) for k in base if k not in names)
    by_peft = copy.deepcopy(peft).merge_and_unload().state_dict()
    assert all(torch.allclose(merged[k], by_peft[k], rtol=0, atol=1e-6) for k in base)
    # the training model is untouched: same tensors, adapters still unmerged
    assert all(torch.equal(v, live[k]) for k, v in peft.state_dict().items())
    assert not any(getattr(m, "merged", False) for m in peft.modules())


def test_an_engine_loaded_from_the_merged_dict_gives_the_lora_logits(tiny_model_dir: Path) -> None:
    peft = _trained_lora(tiny_model_dir)
    engine = HFEngine(tiny_model_dir)
    engine.load_weights(1, merged_state_dict(peft))  # strict on names: refuses peft keys
    with torch.no_grad():
        want = peft(input_ids=IDS).logits
        got = engine.model(input_ids=IDS).logits
    assert not torch.allclose(want, load_model(tiny_model_dir)(input_ids=IDS).logits, atol=1e-3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_bf16_merge_keeps_the_base_dtype_and_rounds_once(tiny_model_dir: Path) -> None:
    peft = _trained_lora(tiny_model_dir, torch.bfloat16)
    merged = merged_state_dict(peft)
    assert all(v.dtype == torch.bfloat16 for v in merged.values())
    want = _by_hand(copy.deepcopy(peft).float())  # fp32 merge of the bf16 tensors
    assert all(torch.equal(merged[k], want[k].to(torch.bfloat16)) for k in want)


def _cfg() -> object:
    return load_run_config(data={"model": {"lora_rank": RANK}, "optim": {"lr": 1e-2}})


def test_learner_publishes_the_stepped_merged_weights(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    got: dict[int, dict[str, torch.Tensor]] = {}

    def publish(version: int, weights: dict[str, torch.Tensor]) -> int:
        got[version] = {k: v.clone() for k, v in weights.items()}
        return version

    learner = Learner(load_model(tiny_model_dir), _cfg(), publish=publish)
    before = {k: v.clone() for k, v in learner.weights().items()}
    replay_update(learner, grpo_batch, Schedule.STREAM)
    after = merged_state_dict(learner.model)  # theta_1, not theta_0 read before the step
    assert list(got) == [1] and list(got[1]) == list(load_model(tiny_model_dir).state_dict())
    assert all(torch.equal(got[1][k], after[k]) for k in after)
    assert any(not torch.equal(got[1][k], before[k]) for k in adapted_names(learner.model))


def test_lora_checkpoint_resumes_to_the_same_published_weights(
    tiny_model_dir: Path, grpo_batch: LoggedBatch, tmp_path: Path
) -> None:
    first = Learner(load_model(tiny_model_dir), _cfg())
    replay_update(first, grpo_batch, Schedule.STREAM)
    save_checkpoint(first, tmp_path)
    resumed = Learner(load_model(tiny_model_dir), _cfg())  # base weights + fresh adapters
    assert load_checkpoint(resumed, tmp_path) == 1
    a, b = first.weights(), resumed.weights()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_merge_refuses_what_it_does_not_cover(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match="DoRA"):
        merged_state_dict(get_peft_model(load_model(tiny_model_dir), cfg))


def test_all_linear_targets_adapt_every_projection_and_merge_exactly(
    tiny_model_dir: Path,
) -> None:
    """`model.lora_targets: [all-linear]` (the paper's setting): every attention and MLP
    projection of every layer is adapted, not the output head, and the merge still equals
    W + (alpha / r) B @ A by hand; a fractional alpha is kept, not truncated."""
    alpha = 10.5
    peft = apply_lora(load_model(tiny_model_dir), RANK, alpha, seed=0, targets=["all-linear"])
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    names = adapted_names(peft)
    layers = load_model(tiny_model_dir).config.num_hidden_layers
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(names) == layers * len(projections)
    assert {n.split(".")[-2] for n in names} == set(projections) and "lm_head.weight" not in names
    merged, state = merged_state_dict(peft), peft.state_dict()
    for name in names:
        stem = "base_model.model." + name.removesuffix(".weight")
        w = state[f"{stem}.base_layer.weight"]
        a, b = state[f"{stem}.lora_A.default.weight"], state[f"{stem}.lora_B.default.weight"]
        torch.testing.assert_close(merged[name], w + (alpha / RANK) * (b @ a), rtol=0, atol=1e-6)


def test_lora_targets_are_checked_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"model.lora_targets \['qkv'\] name no linear layer"):
        apply_lora(load_model(tiny_model_dir), RANK, ALPHA, targets=["q_proj", "qkv"])
    from thundersync.config import ConfigError

    with pytest.raises(ConfigError, match="model.lora_targets"):
        load_run_config("grpo-toy", {"model.lora_targets": []})
    with pytest.raises(ConfigError, match="all-linear already covers"):
        load_run_config("grpo-toy", {"model.lora_targets": ["all-linear", "q_proj"]})
    cfg = load_run_config("grpo-toy", {"model.lora_rank": 2, "model.lora_targets": ["all-linear"]})
    assert cfg.model.lora_targets == ["all-linear"]
