"""A model's shape (what the memory plan needs of it), read from an HF `config.json`.

Why a shape and not the model: the plan must answer for an 8B or 32B model on a machine that
cannot hold it (or before its weights are downloaded), so it works from the config alone; the
parameter counts below are the exact HF Llama / Qwen2 / Qwen3 layouts (checked against real
parameter shapes on the meta device by `tsrl bench plan-check`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAPES_DIR = Path(__file__).parent / "shapes"

# LoRA targets and their (in, out) sides, by module name (`model.lora_targets`)
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ShapeError(ValueError):
    """A model shape that cannot be read; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool  # Qwen2 always; Llama / Qwen3 when `attention_bias`
    qk_norm: bool  # Qwen3: an RMSNorm over each head's q and k

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_sides(self) -> dict[str, tuple[int, int]]:
        d, i = self.hidden, self.intermediate
        q, kv = self.q_dim, self.kv_dim
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, i),
            "up_proj": (d, i),
            "down_proj": (i, d),
        }

    @property
    def layer_params(self) -> int:
        lin = sum(a * b for a, b in self.linear_sides().values())
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return lin + bias + norms

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The untied LM head (0 when tied to the embedding)."""
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every parameter of the HF model (N)."""
        return self.embed_params + self.layers * self.layer_params + self.hidden + self.head_params

    @property
    def largest_param(self) -> int:
        """Elements of the largest single parameter tensor (per-tensor transients)."""
        d = self.hidden
        return max(self.vocab * d, self.intermediate * d, self.q_dim * d)

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Trainable adapter parameters: r x (in + out) per adapted linear layer."""
        names = _LINEARS if "all-linear" in targets else [t for t in targets if t in _LINEARS]
        sides = self.linear_sides()
        return self.layers * sum(rank * sum(sides[n]) for n in names)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "params": self.params}


def shape_from_config(cfg: dict[str, Any], name: str, where: str = "config.json") -> ModelShape:
    """A shape from an HF config dict; a missing field is a ShapeError naming `where`."""

    def need(key: str) -> int:
        v = cfg.get(key)
        if not isinstance(v, int) or v < 1:
            raise ShapeError(
                f"{where}: field {key!r} is {v!r}; give a positive integer (an HF causal LM "
                "config.json: hidden_size, num_hidden_layers, num_attention_heads, ...)"
            )
        return v

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    model_type = str(cfg.get("model_type", "llama"))
    return ModelShape(
        name=name,
        model_type=model_type,
        hidden=hidden,
        layers=need("num_hidden_layers"),
        heads=heads,
        kv_heads=int(kv),
        head_dim=int(head_dim),
        intermediate=need("intermediate_size"),
        vocab=need("vocab_size"),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def shipped_shapes() -> list[str]:
    return sorted(p.stem for p in SHAPES_DIR.glob("*.json"))


def load_shape(ref: str | Path) -> ModelShape:
    """A shipped shape by name (`qwen3-8b`), a config.json, or a model directory holding one."""
    p = Path(ref)
    shipped = SHAPES_DIR / f"{ref}.json"
    if shipped.is_file():
        p = shipped
    elif p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ShapeError(
            f"model shape {str(ref)!r}: no such shape or config.json; use one of "
            f"{shipped_shapes()}, a model directory or a config.json path (--shape)"
        )
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise ShapeError(f"{p}: cannot read it as JSON ({err}); give an HF config.json") from None
    name = p.stem if p.parent == SHAPES_DIR else p.parent.name
    return shape_from_config(cfg, name, str(p))


def shape_for_run(model_path: str | None, shape: str | None = None) -> ModelShape:
    """The shape a plan uses: `shape` (--shape) when given; else `model.path`'s config.json;
    else the shipped shape named like `model.path`'s last part (`/models/qwen3-8b` ->
    qwen3-8b: a recipe for a cluster plans here without the weights)."""
    if shape:
        return load_shape(shape)
    if not model_path:
        raise ShapeError(
            "model.path is not set (a tiny model is built at run time): pass --shape NAME "
            f"(one of {shipped_shapes()}) or --shape path/to/config.json"
        )
    here = Path(model_path)
    if (here / "config.json").is_file():
        return load_shape(here)
    if here.name.lower() in shipped_shapes():
        return load_shape(here.name.lower())
    raise ShapeError(
        f"model.path {model_path!r} has no config.json here and names no shipped shape: pass "
        f"--shape NAME (one of {shipped_shapes()}) or --shape path/to/config.json"
    )
