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

from thundersync.learner.routed_ops import routable_embedding, routed_embedding

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
    hidden: torch.Tensor  # [L, d] the decoder's last hidden state for the segment's own positions
    kv: list[KV]  # this segment's own K/V per layer, still in the graph


def _decode(
    model: nn.Module, ids: torch.Tensor, pos: torch.Tensor, past: Sequence[KV]
) -> tuple[torch.Tensor, ...]:
    """The decoder on one segment: (hidden, K_0, V_0, K_1, ...) of its own positions."""
    decoder: Any = _base_model(model).model
    kwargs: dict[str, object] = {"position_ids": pos, "use_cache": True}
    embed = getattr(decoder, "embed_tokens", None)
    if routable_embedding(embed):  # its gradient as rows, not a dense [V, d] per backward
        kwargs["inputs_embeds"] = routed_embedding(embed, ids)
    else:
        kwargs["input_ids"] = ids
    past_len = 0
    if past:
        dyn = DynamicCache()
        for layer, (k, v) in enumerate(past):
            dyn.update(k, v, layer)
        past_len = dyn.get_seq_length()
        decoder_cls: Any = type(decoder)
        kwargs[_cache_kwarg(decoder_cls)] = dyn
    out = decoder(**kwargs)  # LoRA layers, if any, are injected in place
    # own K/V as compact tensors: a view would keep the whole [past; own] concatenation alive
    own = [
        t[:, :, past_len:].contiguous()
        for layer in out.past_key_values.layers
        for t in (layer.keys, layer.values)
    ]
    return (out.last_hidden_state[0], *own)


def run_segment(
    model: nn.Module,
    token_ids: torch.Tensor,
    *,
    past: Sequence[KV],
    start: int,
    checkpoint: bool = False,
) -> SegmentOutput:
    """Forward `token_ids` ([L] long) at positions start.. on top of the leaf K/V in `past`.

    `past` is one (K, V) pair per layer covering positions 0..start-1 (empty for a segment
    that starts the sequence). `checkpoint`: keep only the inputs and outputs for backward and
    recompute the segment's activations there (activation checkpointing; eval mode, so the
    recompute is the same function). Log-probs come from `learner.logprobs.scored_logprobs`.
    """
    ids = token_ids.view(1, -1)
    length = ids.shape[1]
    pos = torch.arange(start, start + length, dtype=torch.long, device=ids.device).view(1, -1)
    if past:
        held = past[0][0].shape[2]
        if held != start:
            raise ValueError(f"segment starts at position {start} but its past holds {held}")
    elif start != 0:
        raise ValueError(f"a segment without past must start at position 0, not {start}")
    if checkpoint and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint as ckpt

        flat = [t for kv in past for t in kv]

        def fn(ids_: torch.Tensor, pos_: torch.Tensor, *tensors: torch.Tensor) -> Any:
            pairs = [(tensors[i], tensors[i + 1]) for i in range(0, len(tensors), 2)]
            return _decode(model, ids_, pos_, pairs)

        outs = ckpt(fn, ids, pos, *flat, use_reentrant=False)
    else:
        outs = _decode(model, ids, pos, past)
    hidden, own = outs[0], outs[1:]
    kv = [(own[i], own[i + 1]) for i in range(0, len(own), 2)]
    return SegmentOutput(hidden=hidden, kv=kv)


def detach_leaves(kv: Sequence[KV]) -> list[KV]:
    return [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in kv]
