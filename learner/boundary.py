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
    logits: torch.Tensor | None  # [L, V] fp32 for the segment's own positions (None: not asked)
    kv: list[KV]  # this segment's own K/V per layer, still in the graph


def lm_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head in fp32 whatever the model's dtype (bf16 logits lose the log-prob's digits):
    fp32 copies of the hidden states and the head weight, so the gradient still reaches both."""
    head: Any = _base_model(model).lm_head
    dt = torch.promote_types(hidden.dtype, torch.float32)  # float64 models stay float64
    bias = head.bias.to(dt) if getattr(head, "bias", None) is not None else None
    return torch.nn.functional.linear(hidden.to(dt), head.weight.to(dt), bias)


def run_segment(
    model: nn.Module,
    token_ids: torch.Tensor,
    *,
    past: Sequence[Sequence[KV]],
    start: int,
    logits: bool = True,
) -> SegmentOutput:
    """Forward `token_ids` ([L] long) at positions start.. on top of the leaf K/V in `past`.

    `past` is a list of earlier segments, each a per-layer list of (K, V) leaves; they are
    concatenated along the sequence axis into a fresh cache. The decoder runs in the model's
    dtype; the head (when `logits`) in fp32 (`lm_logits`).
    """
    ids = token_ids.view(1, -1)
    length = ids.shape[1]
    pos = torch.arange(start, start + length, dtype=torch.long, device=ids.device).view(1, -1)
    kwargs: dict[str, object] = {"input_ids": ids, "position_ids": pos, "use_cache": True}
    past_len = 0
    decoder: Any = _base_model(model).model
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
        decoder_cls: Any = type(decoder)
        kwargs[_cache_kwarg(decoder_cls)] = dyn
    elif start != 0:
        raise ValueError(f"a segment without past must start at position 0, not {start}")
    out = decoder(**kwargs)  # LoRA layers, if any, are injected in place
    grown = out.past_key_values
    own = [(layer.keys[:, :, past_len:], layer.values[:, :, past_len:]) for layer in grown.layers]
    head = lm_logits(model, out.last_hidden_state[0]) if logits else None
    return SegmentOutput(logits=head, kv=own)


def detach_leaves(kv: Sequence[KV]) -> list[KV]:
    return [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in kv]


def token_logprobs(logits: torch.Tensor | None, token_ids: torch.Tensor) -> torch.Tensor:
    """log pi(token_t | prefix) for t = 1..L-1 of the segment (token 0 is predicted elsewhere)."""
    if logits is None:
        raise ValueError("this segment was run without logits (run_segment(..., logits=True))")
    logp = torch.log_softmax(logits[:-1].to(torch.promote_types(logits.dtype, torch.float32)), -1)
    return logp.gather(-1, token_ids[1:].view(-1, 1)).squeeze(-1)
