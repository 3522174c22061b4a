"""HF Llama made truly float64 for exactness tests: its RMSNorm, RoPE tables and eager softmax
compute in float32 whatever the model's dtype, which would cap a float64 comparison at ~1e-7.
`tests/conftest.py` exposes `patch_llama_in_dtype` as the `true_float64` fixture;
`install_in_dtype` patches a process outside pytest (tests/driver/test_failure_policy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers.models.llama import modeling_llama as hf_llama

if TYPE_CHECKING:  # importable without pytest: a spawned learner's sitecustomize imports it
    import pytest


def _rms_norm_in_dtype(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    var = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(var + self.variance_epsilon))


@torch.no_grad()
def _rope_in_dtype(
    self: Any, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if self.rope_type != "default":
        raise NotImplementedError(f"rope_type {self.rope_type!r} is not patched for float64")
    cfg = self.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # the buffer inv_freq was computed in fp32 at init: recompute it in the input dtype
    exponent = torch.arange(0, dim, 2, dtype=x.dtype, device=x.device) / dim
    inv_freq = 1.0 / (cfg.rope_parameters["rope_theta"] ** exponent)
    freqs = position_ids[..., None].to(x.dtype) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def _eager_attention_in_dtype(
    module: Any,  # a LlamaAttention
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    n_rep = int(module.num_key_value_groups)
    key = key.repeat_interleave(n_rep, dim=1)
    value = value.repeat_interleave(n_rep, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)  # in the input dtype, not fp32
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def install_in_dtype() -> None:
    """The same patches for the rest of this process (no restore)."""
    hf_llama.LlamaRMSNorm.forward = _rms_norm_in_dtype  # type: ignore[method-assign]
    hf_llama.LlamaRotaryEmbedding.forward = _rope_in_dtype  # type: ignore[method-assign,assignment]
    hf_llama.eager_attention_forward = _eager_attention_in_dtype


def patch_llama_in_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF Llama's RMSNorm, RoPE tables and eager softmax in the input dtype (restored after)."""
    monkeypatch.setattr(hf_llama.LlamaRMSNorm, "forward", _rms_norm_in_dtype)
    monkeypatch.setattr(hf_llama.LlamaRotaryEmbedding, "forward", _rope_in_dtype)
    monkeypatch.setattr(hf_llama, "eager_attention_forward", _eager_attention_in_dtype)
