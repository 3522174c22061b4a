"""Tiny models of each family (llama, qwen2, qwen3): deterministic, untied, full attention, and
loadable by `load_model` (SDPA by default) from the same locally trained tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.config import Arch, ConfigError, load_run_config
from thundersync.hf_models import build_tiny_model, load_model, load_tokenizer
from thundersync.learner.arch import check_cuttable
from thundersync.rundir import RunFiles

_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", list(Arch))
def test_tiny_model_of_each_family_is_deterministic_and_loads_with_sdpa(
    tmp_path: Path, tiny_model_dir: Path, arch: Arch
) -> None:
    a = build_tiny_model(tmp_path / "a", seed=0, arch=arch)
    b = build_tiny_model(tmp_path / "b", seed=0, arch=arch)
    c = build_tiny_model(tmp_path / "c", seed=5, arch=arch)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")
    # one tokenizer for every family: OPD students and teachers may mix families
    assert _sha(a / "tokenizer.json") == _sha(tiny_model_dir / "tokenizer.json")
    raw = json.loads((a / "config.json").read_text())
    assert raw["model_type"] == arch.value and raw["tie_word_embeddings"] is False
    if arch is not Arch.LLAMA:
        assert raw["use_sliding_window"] is False and raw["sliding_window"] is None
        assert raw["layer_types"] == ["full_attention"] * 2
    model = load_model(a)
    assert type(model).__name__ == _CLASS[arch.value]
    assert model.config._attn_implementation == "sdpa" and not model.training
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    head_dim = getattr(model.config, "head_dim", None) or 64 // 4
    assert head_dim >= 16
    head: Any = model.get_output_embeddings()
    embed: Any = model.get_input_embeddings()
    assert head.weight.data_ptr() != embed.weight.data_ptr()
    check_cuttable(model)  # full attention everywhere: the learner may cut its cache
    tok = load_tokenizer(a)
    ids = tok("git diff tests").input_ids
    assert tok.decode(ids) == "git diff tests"
    eager = load_model(a, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    x = torch.tensor([ids + ids])
    with torch.no_grad():
        diff = (model(input_ids=x).logits - eager(input_ids=x).logits).abs().max()
    assert float(diff) < 1e-5


def test_qwen3_sets_head_dim_explicitly(tmp_path: Path) -> None:
    raw = json.loads((build_tiny_model(tmp_path / "q", arch="qwen3") / "config.json").read_text())
    assert raw["head_dim"] == 16 and raw["num_attention_heads"] == 4


def test_load_model_reads_a_float64_qwen2(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "q", arch=Arch.QWEN2), dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_cli_model_tiny_arch(tmp_path: Path, arch: str) -> None:
    res = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "m"), "--arch", arch])
    assert res.exit_code == 0, res.output
    assert res.output.strip().endswith(str(tmp_path / "m"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == arch and cfg["tie_word_embeddings"] is False


def test_cli_model_tiny_rejects_an_unknown_arch(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "m"), "--arch", "mamba"])
    assert res.exit_code == 2
    assert "qwen3" in res.output and not (tmp_path / "m").exists()


def test_model_tiny_arch_config_field() -> None:
    assert load_run_config().model.tiny_arch is Arch.LLAMA
    assert load_run_config(data={"model": {"tiny_arch": "qwen3"}}).model.tiny_arch is Arch.QWEN3
    with pytest.raises(ConfigError, match=r"model\.tiny_arch"):
        load_run_config(data={"model": {"tiny_arch": "mamba"}})


def test_build_models_passes_tiny_arch_to_student_and_teacher(tmp_path: Path) -> None:
    from thundersync.driver.assemble import build_models

    cfg = load_run_config(data={"objective": "opd", "model": {"tiny_arch": "qwen2"}})
    student, teacher = build_models(cfg, RunFiles(tmp_path))
    assert teacher is not None
    for d in (student, teacher):
        assert json.loads((d / "config.json").read_text())["model_type"] == "qwen2"
