"""Causal attention on top of a past without an explicit mask: `use_causal_kernel(model)`.

Why: the learner runs every continuation / turn on top of detached past K/V, so q_len < kv_len.
HF's sdpa path then builds an explicit [q, kv] mask, and a masked SDPA computes every block
(the CPU flash kernel: 1.8x the time of `is_causal` at 4096 tokens; on CUDA a mask rules out the
flash kernel, and SDPA keeps the mask per layer for backward). SDPA's `is_causal` is top-left
aligned, so the mask cannot simply be dropped. Instead:
- a past no longer than the segment: the query is padded in front with `past` zero rows; [0; Q]
  against K/V of the same length is plain top-left causal, which equals the lower-right causal
  of Q against K/V, and the padded rows' outputs are dropped (their zero output gradient adds
  exactly 0 to dK / dV);
- a longer past (OPD's late turns: a few rows against a long history, where padding would cost
  past x kv): torch's lower-right `CausalBias`, which CUDA's flash kernel takes natively and
  which elsewhere is materialised as the same bool mask HF would build.
A padding mask, a window or any other mask goes to HF's sdpa unchanged. Same maths; the bits
differ from the masked kernel only by the kernels' summation order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    causal_mask_function,
    sdpa_mask,
)

CAUSAL_KERNEL = "thundersync_causal_sdpa"


def _is_plain_causal(mask_function: Any, attention_mask: Any, local_size: Any) -> bool:
    if mask_function is not causal_mask_function or local_size is not None:
        return False
    return attention_mask is None or bool(attention_mask.all())


def causal_mask(
    *,
    mask_function: Any = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """None for a plain causal mask (`causal_attention` aligns it); otherwise HF's sdpa mask."""
    if _is_plain_causal(mask_function, attention_mask, local_size):
        return None
    return sdpa_mask(
        mask_function=mask_function, attention_mask=attention_mask, local_size=local_size, **kwargs
    )


def causal_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF's sdpa attention, with a mask-free lower-right causal for q_len < kv_len (see above)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is not None or q_len == 1 or q_len >= kv_len:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    past = kv_len - q_len
    groups = getattr(module, "num_key_value_groups", 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    drop, scale = kwargs.get("dropout", 0.0), kwargs.get("scaling")
    if past > q_len:
        # the bias is an empty marker tensor: made outside any dispatch mode (FakeTensor, a
        # memory meter), which would otherwise claim it before it becomes a CausalBias
        with _disable_current_modes():
            bias = causal_lower_right(q_len, kv_len)
        k, v = repeat_kv(key, groups), repeat_kv(value, groups)
        out = sdpa(query, k, v, attn_mask=bias, dropout_p=drop, scale=scale)
        return out.transpose(1, 2).contiguous(), None
    # grouped K/V stay grouped where a fused kernel takes them (CPU flash; CUDA flash is 16-bit
    # only, and fp32 there would fall to the math kernel, which keeps [H, L, L] scores)
    gqa = groups > 1 and (query.device.type == "cpu" or query.element_size() == 2)
    k, v = (
        (key, value) if gqa or groups == 1 else (repeat_kv(key, groups), repeat_kv(value, groups))
    )
    pad = query.new_zeros(*query.shape[:2], past, query.shape[3])
    out = sdpa(
        torch.cat([pad, query], dim=2),
        k,
        v,
        is_causal=True,
        dropout_p=drop,
        scale=scale,
        enable_gqa=gqa,
    )
    return out[:, :, past:].transpose(1, 2).contiguous(), None  # [B, q, H, d], padding dropped


def _register() -> None:
    AttentionInterface.register(CAUSAL_KERNEL, causal_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CAUSAL_KERNEL, causal_mask)


def use_causal_kernel(model: nn.Module) -> bool:
    """Switch a model on HF's sdpa to the mask-free causal path; True if it was switched.

    Other kernels are left as they are: eager (tests' references) and flash-attention (which
    aligns causal masks lower-right itself).
    """
    get_base = getattr(model, "get_base_model", None)
    base: Any = get_base() if callable(get_base) else model
    config = getattr(base, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    base.set_attn_implementation(CAUSAL_KERNEL)
    return True
