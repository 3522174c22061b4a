"""KV-cache cut boundaries: run a segment on top of detached leaf K/V and get adjoints for them.

Why this exists: the shared prompt of a GRPO group (and the earlier turns of an OPD trajectory)
must be backpropagated once, not once per continuation. We run the prefix with the cache on, cut
its K/V into detached leaves, run each continuation on a fresh cache built from those leaves, and
take gradients for the parameters *and* the leaves; the leaves' adjoints are later pushed through
the prefix graph once.

Silent traps handled here (each gave wrong numbers without an error, see docs/DESIGN.md):
- the cache keyword is `past_key_values` up to transformers 5.19 and `cache` from 5.24; we read the
  name off the forward signature;
- a cache grows in place, so every forward gets a fresh DynamicCache built from the leaves;
- RoPE positions come only from `position_ids`, so they are always passed explicitly.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

KV = tuple[torch.Tensor, torch.Tensor]


@cache
def _cache_kwarg(cls: Any) -> str:
    params = inspect.signature(cls.forward).parameters
    if "past_key_values" in params:
        return "past_key_values"
    if "cache" in params:
        return "cache"
    raise TypeError(f"{cls.__name__}.forward takes neither past_key_values nor cache")


def _base_model(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@dataclass
class SegmentOutput:
    logits: torch.Tensor  # [L, V] for the segment's own positions
    kv: list[KV]  # this segment's own K/V per layer, still in the graph


def run_segment(
    model: nn.Module, token_ids: torch.Tensor, *, past: Sequence[Sequence[KV]], start: int
) -> SegmentOutput:
    """Forward `token_ids` ([L] long) at positions start.. on top of the leaf K/V in `past`.

    `past` is a list of earlier segments, each a per-layer list of (K, V) leaves; they are
    concatenated along the sequence axis into a fresh cache.
    """
    ids = token_ids.view(1, -1)
    length = ids.shape[1]
    pos = torch.arange(start, start + length, dtype=torch.long).view(1, -1)
    kwargs: dict[str, object] = {"input_ids": ids, "position_ids": pos, "use_cache": True}
    past_len = 0
    if past:
        n_layers = len(past[0])
        dyn = DynamicCache()
        for layer in range(n_layers):
            k = torch.cat([seg[layer][0] for seg in past], dim=2)
            v = torch.cat([seg[layer][1] for seg in past], dim=2)
            dyn.update(k, v, layer)
        past_len = dyn.get_seq_length()
        if past_len != start:
            raise ValueError(f"segment starts at position {start} but its past holds {past_len}")
        base_cls: Any = type(_base_model(model))
        kwargs[_cache_kwarg(base_cls)] = dyn
    elif start != 0:
        raise ValueError(f"a segment without past must start at position 0, not {start}")
    out = model(**kwargs)
    grown = out.past_key_values
    own = [(layer.keys[:, :, past_len:], layer.values[:, :, past_len:]) for layer in grown.layers]
    return SegmentOutput(logits=out.logits[0], kv=own)


def detach_leaves(kv: Sequence[KV]) -> list[KV]:
    return [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in kv]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log pi(token_t | prefix) for t = 1..L-1 of the segment (token 0 is predicted elsewhere)."""
    logp = torch.log_softmax(
        logits[:-1].float() if logits.dtype == torch.bfloat16 else logits[:-1], -1
    )
    return logp.gather(-1, token_ids[1:].view(-1, 1)).squeeze(-1)
