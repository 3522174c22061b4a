from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thundersync.cli import app
from thundersync.config import ConfigError, load_run_config
from thundersync.hf_models import build_tiny_model, load_model, load_tokenizer


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_tiny_model_is_deterministic_and_loads_offline(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _sha(again / "model.safetensors") == _sha(tiny_model_dir / "model.safetensors")
    other = build_tiny_model(tmp_path / "other", seed=3)
    assert _sha(other / "model.safetensors") != _sha(tiny_model_dir / "model.safetensors")
    model = load_model(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    assert model.config.tie_word_embeddings is False
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    ids = tok("git diff tests").input_ids
    assert tok.decode(ids) == "git diff tests"


def test_cli_model_tiny_writes_hf_directory(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "m"), "--seed", "2"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is False


def test_config_error_names_field_and_fix() -> None:
    with pytest.raises(ConfigError) as ei:
        load_run_config(data={"learner": {"token_weighting": "bogus"}})
    assert "learner.token_weighting" in str(ei.value) and "seq_mean" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_run_config(data={"optim": {"lr": -1}})
    assert "optim.lr" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_run_config(data={"updatez": 3})
    assert "updatez" in str(ei.value) and "unknown field" in str(ei.value)


def test_recipe_with_dotted_overrides() -> None:
    cfg = load_run_config("grpo-toy", {"updates": 2, "optim.lr": 0.01})
    assert cfg.updates == 2 and cfg.optim.lr == 0.01
    with pytest.raises(ConfigError, match="not found"):
        load_run_config("no-such-recipe")
