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
- RoPE positions come only from `position_ids`, so they are always passed explicitly;
- per-layer checkpointing (`learner.activation_checkpointing: layer`) replays a layer's forward
  in its backward, cache update included: its cache layer rebuilds [past; own] on every update
  instead of appending (HF's own per-layer checkpointing drops the cache, hence the K/V).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from thundersync.config import Checkpointing
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


class _ReplayLayer(DynamicLayer):
    """A cache layer whose `update` may run again (a checkpointed layer's recompute): it returns
    the fixed past plus the new K/V and stores nothing it concatenated, so neither a second call
    nor the backward keeps a [past; own] copy; the forward's own K/V are kept once (`own`)."""

    def __init__(self, past: KV | None) -> None:
        super().__init__()
        self.past = past
        self.own: KV | None = None
        self.recorded = False
        if past is not None:
            self.lazy_initialization(*past)
            self.keys, self.values = past  # what get_seq_length / mask sizes read

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.recorded:  # the forward, not a recompute
            self.own, self.recorded = (key_states, value_states), True
        if self.past is None:
            return key_states, value_states
        k = torch.cat([self.past[0], key_states], dim=-2)
        return k, torch.cat([self.past[1], value_states], dim=-2)


@contextmanager
def _layers_checkpointed(layers: nn.ModuleList) -> Iterator[None]:
    """Each decoder layer's forward in its own non-reentrant checkpoint, for this forward."""
    from torch.utils.checkpoint import checkpoint as ckpt

    for layer in layers:
        plain = layer.forward
        layer.forward = partial(ckpt, plain, use_reentrant=False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again


def _decode(
    model: nn.Module,
    ids: torch.Tensor,
    pos: torch.Tensor,
    past: Sequence[KV],
    per_layer: bool = False,
) -> tuple[torch.Tensor, ...]:
    """The decoder on one segment: (hidden, K_0, V_0, K_1, ...) of its own positions."""
    decoder: Any = _base_model(model).model
    kwargs: dict[str, object] = {"position_ids": pos, "use_cache": True}
    embed = getattr(decoder, "embed_tokens", None)
    if routable_embedding(embed):  # its gradient as rows, not a dense [V, d] per backward
        kwargs["inputs_embeds"] = routed_embedding(embed, ids)
    else:
        kwargs["input_ids"] = ids
    past_len = past[0][0].shape[2] if past else 0
    dyn = None
    if per_layer:
        dyn = DynamicCache()
        n = len(past) if past else len(decoder.layers)
        dyn.layers = [_ReplayLayer(past[i] if past else None) for i in range(n)]
    elif past:
        dyn = DynamicCache()
        for layer, (k, v) in enumerate(past):
            dyn.update(k, v, layer)
    if dyn is not None:
        decoder_cls: Any = type(decoder)
        kwargs[_cache_kwarg(decoder_cls)] = dyn
    if per_layer:
        with _layers_checkpointed(decoder.layers):
            out = decoder(**kwargs)
    else:
        out = decoder(**kwargs)  # LoRA layers, if any, are injected in place
    if per_layer:  # the checkpoints hold the cache until backward: it lets go of own K/V
        own = []
        for layer in out.past_key_values.layers:
            own += [t.contiguous() for t in layer.own]
            layer.own = None
        return (out.last_hidden_state[0], *own)
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
    checkpoint: Checkpointing | bool | str = False,
) -> SegmentOutput:
    """Forward `token_ids` ([L] long) at positions start.. on top of the leaf K/V in `past`.

    `past` is one (K, V) pair per layer covering positions 0..start-1 (empty for a segment
    that starts the sequence). `checkpoint` (`Checkpointing`; True: segment): recompute the
    activations in the backward, of the whole segment or of one decoder layer at a time (eval
    mode, so the recompute is the same function). Log-probs come from `learner.logprobs.scored_logprobs`.
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
    mode = Checkpointing.of(checkpoint) if torch.is_grad_enabled() else Checkpointing.NONE
    if mode is Checkpointing.SEGMENT:
        from torch.utils.checkpoint import checkpoint as ckpt

        flat = [t for kv in past for t in kv]

        def fn(ids_: torch.Tensor, pos_: torch.Tensor, *tensors: torch.Tensor) -> Any:
            pairs = [(tensors[i], tensors[i + 1]) for i in range(0, len(tensors), 2)]
            return _decode(model, ids_, pos_, pairs)

        outs = ckpt(fn, ids, pos, *flat, use_reentrant=False)
    else:
        outs = _decode(model, ids, pos, past, per_layer=mode is Checkpointing.LAYER)
    hidden, own = outs[0], outs[1:]
    kv = [(own[i], own[i + 1]) for i in range(0, len(own), 2)]
    return SegmentOutput(hidden=hidden, kv=kv)


def detach_leaves(kv: Sequence[KV]) -> list[KV]:
    return [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in kv]
