"""Which architectures the learner's K/V-cache cuts are exact for: `check_cuttable(model)`.

learner/boundary.py cuts a model's cache at segment boundaries: a prefix's per-layer K/V become
detached leaves and the next segment runs on a fresh `DynamicCache` built from them. That equals
one full forward only when every decoder layer is full causal attention whose whole state is its
K/V. Anything else is refused here, before any number is computed:
- linear-attention / state-space / convolution layers (Qwen3-Next's gated delta net, Mamba, LFM2's
  short conv, hybrid stacks): their cache holds a recurrent state, not K/V;
- sliding-window or chunked attention: a windowed cache layer keeps only the last W tokens, so the
  cut-out leaves would miss keys, and a fresh plain cache would not know the window;
- encoder-decoder models (the cut is of a decoder-only cache).
The checks read the config (`layer_types`, `layers_block_type`, `use_sliding_window`,
`sliding_window`, `attention_chunk_size`) and the decoder layers themselves (each needs a
self-attention child and no other token mixer), so a config that hides a layer type is caught too.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

_FULL = "full_attention"
_FIX = "Fix: train a model whose decoder layers are all full attention (e.g. llama, qwen2, qwen3)"
_ATTN_NAMES = ("self_attn", "self_attention", "attn", "attention")
# token mixers whose cache is not (only) K/V: matched on a decoder layer's direct children
_MIXER = re.compile(
    r"mamba|ssm|mixer|linearattention|gateddelta|deltanet|conv|recurrent|rglru|rwkv|retention",
    re.IGNORECASE,
)


class UnsupportedArchitecture(ValueError):
    """A model whose K/V cache the learner cannot cut at segment boundaries (with the fix)."""


def _base(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)  # peft wrappers
    return get_base() if callable(get_base) else model


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


def _indices(types: list[Any], ok: tuple[str, ...]) -> dict[str, list[int]]:
    bad: dict[str, list[int]] = {}
    for i, t in enumerate(types):
        if t not in ok:
            bad.setdefault(str(t), []).append(i)
    return bad


def _window(value: Any, max_pos: Any) -> bool:
    """A window / chunk size that actually restricts attention."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return False
    return not isinstance(max_pos, int) or value < max_pos


def config_problems(config: Any) -> list[str]:
    """Why the boundary code cannot cut a model with this config (empty: it can)."""
    cfg = _text_config(config)
    out: list[str] = []
    if getattr(cfg, "is_encoder_decoder", False):
        out.append("it is an encoder-decoder model (config.is_encoder_decoder=True)")
    for attr, ok in (("layer_types", (_FULL,)), ("layers_block_type", (_FULL, "attention"))):
        types = getattr(cfg, attr, None)
        if not isinstance(types, list | tuple):
            continue
        for kind, idx in _indices(list(types), ok).items():
            out.append(
                f"layer(s) {idx} are {kind!r} (config.{attr}); only 'full_attention' layers keep "
                "their whole state in K/V"
            )
        if out:
            break  # layer_types and layers_block_type are often aliases: report once
    max_pos = getattr(cfg, "max_position_embeddings", None)
    sw = getattr(cfg, "sliding_window", None)
    use_sw = getattr(cfg, "use_sliding_window", None)
    if use_sw is not False and _window(sw, max_pos):
        flag = f"use_sliding_window={use_sw}, " if use_sw is not None else ""
        out.append(
            f"sliding-window attention is on ({flag}sliding_window={sw} < "
            f"max_position_embeddings={max_pos}): a windowed cache keeps only the last {sw} tokens; "
            "set use_sliding_window=False (or sliding_window >= max_position_embeddings) in "
            "config.json if the model was trained with full attention"
        )
    chunk = getattr(cfg, "attention_chunk_size", None)
    if _window(chunk, max_pos):
        out.append(
            f"chunked attention is on (attention_chunk_size={chunk} < "
            f"max_position_embeddings={max_pos})"
        )
    return out


def _decoder_layers(model: nn.Module, n_layers: Any) -> nn.ModuleList | None:
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    for wanted in ("layers", "h", "blocks"):
        for name, mod in lists:
            if name.rsplit(".", 1)[-1] == wanted and (
                not isinstance(n_layers, int) or len(mod) == n_layers
            ):
                return mod
    return None


def _is_attention(name: str, child: nn.Module) -> bool:
    cls = type(child).__name__
    if _MIXER.search(cls) and not cls.endswith("Attention"):
        return False
    return name in _ATTN_NAMES or (cls.endswith("Attention") and "linear" not in cls.lower())


def layer_problems(model: nn.Module, n_layers: Any = None) -> list[str]:
    """Decoder layers without a self-attention K/V, or with another token mixer beside it."""
    layers = _decoder_layers(model, n_layers)
    if layers is None:
        return ["its decoder layers were not found (no ModuleList named layers / h / blocks)"]
    out = []
    for i, layer in enumerate(layers):
        kids = list(layer.named_children())
        attn = [n for n, c in kids if _is_attention(n, c)]
        mixers = [
            f"{n}: {type(c).__name__}"
            for n, c in kids
            if n not in attn and (_MIXER.search(type(c).__name__) or _MIXER.search(n))
        ]
        what = type(layer).__name__
        if not attn:
            names = ", ".join(f"{n}: {type(c).__name__}" for n, c in kids)
            out.append(f"decoder layer {i} ({what}) has no self-attention K/V ({names})")
        elif mixers:
            out.append(f"decoder layer {i} ({what}) mixes tokens outside attention too ({mixers})")
    return out


def check_cuttable(model: nn.Module) -> None:
    """Raise `UnsupportedArchitecture` unless the boundary code's K/V cuts are exact for `model`.

    Pure over the model and its config (peft wrappers are unwrapped); returns None when fine.
    """
    base = _base(model)
    config = getattr(base, "config", None)
    problems = config_problems(config) if config is not None else []
    n_layers = getattr(_text_config(config), "num_hidden_layers", None) if config else None
    problems += layer_problems(base, n_layers)
    if problems:
        raise UnsupportedArchitecture(
            f"{type(base).__name__}: the learner cannot cut this model's K/V cache at segment "
            f"boundaries (it would compute wrong gradients): {'; '.join(problems)}. {_FIX}."
        )
