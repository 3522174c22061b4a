"""Checkpoint directories for weight publishing: safetensors weights + the model's config.

The publisher writes one directory per policy version (`<root>/v000007/`) in the HF layout, so any
engine can read it: the HF backend loads the state dict, vLLM reloads from it (or restarts on it).
Files are written to a temporary name and renamed, so a reader never sees a half-written version.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

_WEIGHTS = "model.safetensors"
_COPY_FROM_BASE = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version:06d}"


def save_checkpoint(
    out_dir: str | Path, state_dict: Mapping[str, torch.Tensor], base_dir: str | Path
) -> Path:
    """Write `state_dict` as safetensors plus config/tokenizer files copied from `base_dir`."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    tied = [k for k in tensors if k == "lm_head.weight"]
    if not tied and "model.embed_tokens.weight" in tensors:
        cfg = json.loads((Path(base_dir) / "config.json").read_text())
        if not cfg.get("tie_word_embeddings", True):
            raise ValueError("state dict lacks lm_head.weight for an untied model")
    save_file(tensors, str(tmp / _WEIGHTS), metadata={"format": "pt"})
    for name in _COPY_FROM_BASE:
        src = Path(base_dir) / name
        if src.exists():
            shutil.copy2(src, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def load_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Read every safetensors file of an HF model directory into one state dict."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}: is it an HF model directory?")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
