"""Each tiny family's streamed gradient is the sync one (and the full-forward one); architectures
whose K/V cache the boundary code cannot cut are refused by name, never trained on."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from thundersync.config import Arch, RunConfig, Schedule, load_run_config
from thundersync.hf_models import build_tiny_model, load_model, load_tokenizer, tiny_config
from thundersync.learner.arch import UnsupportedArchitecture, check_cuttable, config_problems
from thundersync.learner.batch_replay import (
    LoggedBatch,
    make_grpo_batch,
    make_opd_batch,
    replay_update,
)
from thundersync.learner.reference import reference_loss
from thundersync.learner.trainer import Learner

# ---- streamed == sync per family ---------------------------------------------------------------


@pytest.fixture(scope="module", params=list(Arch), ids=lambda a: a.value)
def arch_dirs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Arch, Path, Path]:
    arch: Arch = request.param
    root = tmp_path_factory.mktemp(f"arch-{arch.value}")
    student = build_tiny_model(root / "student", seed=0, arch=arch)
    tok = load_tokenizer(student)
    teacher = build_tiny_model(root / "teacher", seed=1, tokenizer=tok, arch=arch)
    return arch, student, teacher


def _cfg(objective: str) -> RunConfig:
    return load_run_config(data={"objective": objective, "optim": {"max_grad_norm": 1e9}})


def _batch(objective: str, teacher: Path) -> LoggedBatch:
    rng = random.Random(3)
    if objective == "grpo":
        return make_grpo_batch(rng, vocab=512, groups=2, group_size=3, reward_offset=10.0)
    return make_opd_batch(rng, load_model(teacher), vocab=512, trajectories=2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_streamed_gradient_equals_sync_gradient_per_family(
    arch_dirs: tuple, objective: str
) -> None:
    arch, student, teacher = arch_dirs
    batch = _batch(objective, teacher)
    cfg = _cfg(objective)
    sync = Learner(load_model(student), cfg)
    stream = Learner(load_model(student), cfg)
    assert torch.equal(sync.flat_params(), stream.flat_params())
    g_sync = replay_update(sync, batch, Schedule.SYNC).grad
    g_stream = replay_update(stream, batch, Schedule.STREAM).grad
    assert float(g_sync.norm()) > 0
    assert _rel(g_stream, g_sync) <= 1e-6, arch
    # the cut itself is exact: the textbook full [prompt; response] forward gives the same grad
    model = load_model(student)
    params = [p for p in model.parameters() if p.requires_grad]
    gs = torch.autograd.grad(reference_loss(model, batch), params)
    ref = torch.cat([g.reshape(-1) for g in gs])
    assert _rel(g_stream, ref) < 1e-5, arch


# ---- refusals ----------------------------------------------------------------------------------


def _small(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return base | kw


@pytest.mark.parametrize("arch", list(Arch))
def test_tiny_families_are_cuttable_bare_and_under_lora(arch: Arch) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(64, hidden=32, arch=arch))
    check_cuttable(model)
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    check_cuttable(get_peft_model(model, lora))


def test_enabled_sliding_window_is_refused_with_the_setting_and_fix() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # max_window_layers=0: every layer slides (layer_types says so too)
    cfg = Qwen2Config(**_small(use_sliding_window=True, sliding_window=16, max_window_layers=0))
    with pytest.raises(UnsupportedArchitecture) as ei:
        check_cuttable(Qwen2ForCausalLM(cfg))
    msg = str(ei.value)
    assert "Qwen2ForCausalLM" in msg and "sliding_window=16" in msg
    assert "'sliding_attention'" in msg and "use_sliding_window=False" in msg and "Fix:" in msg
    assert isinstance(ei.value, ValueError)
    # flag on, window set, but no layer listed as sliding: still refused on the setting
    on = Qwen2Config(**_small(use_sliding_window=True, sliding_window=16))
    assert any("use_sliding_window=True" in p for p in config_problems(on))
    # a window that covers every position restricts nothing
    wide = Qwen2Config(**_small(use_sliding_window=True, sliding_window=256, max_window_layers=4))
    assert config_problems(wide) == []


def test_mistral_window_without_a_flag_is_refused() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    with pytest.raises(UnsupportedArchitecture, match=r"MistralForCausalLM.*sliding_window=16"):
        check_cuttable(MistralForCausalLM(MistralConfig(**_small(sliding_window=16))))
    assert config_problems(MistralConfig(**_small(sliding_window=None))) == []


def test_hybrid_linear_attention_is_refused_naming_the_layer_type() -> None:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        **_small(num_hidden_layers=4),
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    with pytest.raises(UnsupportedArchitecture) as ei:
        check_cuttable(Qwen3NextForCausalLM(cfg))
    msg = str(ei.value)
    assert "Qwen3NextForCausalLM" in msg and "'linear_attention'" in msg and "[0, 1, 2]" in msg
    assert "GatedDeltaNet" in msg  # the layers themselves are named too
    assert "Fix:" in msg


def test_config_alone_with_a_linear_attention_layer_type() -> None:
    from transformers import Qwen2Config

    cfg = Qwen2Config(**_small(layer_types=["full_attention", "linear_attention"]))
    (problem,) = config_problems(cfg)
    assert "[1]" in problem and "'linear_attention'" in problem and "layer_types" in problem


def test_state_space_model_without_attention_is_refused() -> None:
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2)
    with pytest.raises(UnsupportedArchitecture) as ei:
        check_cuttable(MambaForCausalLM(cfg))
    msg = str(ei.value)
    assert "MambaForCausalLM" in msg and "no self-attention K/V" in msg and "MambaMixer" in msg


class GatedDeltaNet(nn.Module):
    """Stands in for a linear-attention mixer a config does not mention."""


def test_layer_structure_is_checked_even_when_the_config_claims_full_attention() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(64, hidden=32, arch=Arch.QWEN3))
    layer = model.model.layers[1]
    del layer.self_attn
    layer.linear_attn = GatedDeltaNet()
    with pytest.raises(UnsupportedArchitecture, match=r"decoder layer 1 .*linear_attn: GatedDelta"):
        check_cuttable(model)
    model.model.layers[0].mamba = GatedDeltaNet()  # a parallel mixer beside attention
    with pytest.raises(UnsupportedArchitecture, match=r"decoder layer 0 .*outside attention"):
        check_cuttable(model)


def test_bench_equivalence_takes_an_arch_and_reports_it() -> None:
    import json

    from typer.testing import CliRunner

    from thundersync.cli import app

    args = ["bench", "equivalence", "--objective", "opd", "--arch", "qwen3", "--updates", "1"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["arch"] == "qwen3" and summary["max_param_gap"] <= 1e-6
    bad = CliRunner().invoke(app, ["bench", "equivalence", "--arch", "mamba"])
    assert bad.exit_code == 2
