"""The learner's mask-free causal attention on a past (`learner.attention`, issue 33).

A segment on past K/V used to get HF's explicit [q, kv] mask (every block computed, K/V repeated
per head). `use_causal_kernel` pads the query in front instead when the past is no longer than the
segment, and passes torch's lower-right `CausalBias` for a longer past. Checked here against the
independent float64 forward of tests/learner/f64_reference.py (plain torch, one whole-sequence
forward, no HF code): logits and gradients (parameters and the
past's K/V leaves, pushed back through the prefix) to 1e-12, on every path (no past, padded
query, lower-right bias, one token); and which SDPA call each path really makes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from f64_reference import forward_logits, load_params, read_config
from torch.overrides import TorchFunctionMode
from transformers import LlamaForCausalLM

from thundersync.hf_models import build_tiny_model
from thundersync.learner.attention import CAUSAL_KERNEL, causal_mask, use_causal_kernel
from thundersync.learner.boundary import detach_leaves, run_segment

# (past, own): padded query (past <= own), HF's mask (past > own), no past, one token on a past
CASES = [(7, 21), (21, 7), (0, 28), (27, 1), (14, 14)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("causal") / "m", seed=3, hidden=64, layers=2)


def _model(model_dir: Path) -> Any:
    model = LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float64, attn_implementation="sdpa"
    )
    model.eval()
    assert use_causal_kernel(model)
    assert model.config._attn_implementation == CAUSAL_KERNEL
    return model


def _segments(model: Any, ids: list[int], past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the last `len(ids) - past` positions, run as prefix + segment on leaf K/V, and
    the same scalar loss both sides use; the leaves' adjoints go back through the prefix graph."""
    t = torch.tensor(ids)
    if past:
        pre = run_segment(model, t[:past], past=[], start=0)
        leaves = detach_leaves(pre.kv)
        seg = run_segment(model, t[past:], past=leaves, start=past)
    else:
        seg = run_segment(model, t, past=[], start=0)
    logits = model.lm_head(seg.hidden)
    loss = _loss(logits)
    loss.backward()
    if past:
        torch.autograd.backward(
            [x for kv in pre.kv for x in kv], [x.grad for kv in leaves for x in kv]
        )
    return logits.detach(), loss.detach()


def _loss(logits: torch.Tensor) -> torch.Tensor:
    """A weighted sum of log-probs, the weights random per position (a constant weight row
    would give every position the same logit adjoint and zero query gradients)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(logits.shape, generator=g, dtype=logits.dtype)
    return (torch.log_softmax(logits, -1) * w).sum()


@pytest.mark.parametrize(("past", "own"), CASES)
def test_segments_on_a_past_equal_the_float64_reference(
    model_dir: Path, true_float64: None, past: int, own: int
) -> None:
    ids = [random.Random(past * 100 + own).randrange(8, 512) for _ in range(past + own)]
    model = _model(model_dir)
    got, _ = _segments(model, ids, past)

    params = load_params(model_dir, torch.float64)
    want = forward_logits(params, read_config(model_dir), ids)[past:]
    _loss(want).backward()
    want = want.detach()
    assert float((got - want).norm() / want.norm()) < 1e-12
    got_g = {n: p.grad for n, p in model.named_parameters()}
    total = torch.cat([params[n].grad.flatten() for n in got_g]).norm()
    for name, g in got_g.items():
        ref = params[name].grad
        assert ref is not None and g is not None, name
        # per parameter, against the whole gradient's norm (layer 0's q_proj gets ~1e-14)
        assert float((g - ref).norm() / total) < 1e-12, name


class _SdpaCalls(TorchFunctionMode):
    """Records each SDPA call the model makes: (mask kind, is_causal, q_len, kv_len, kv heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str | None, bool, int, int, int]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k = args[0], args[1]
            mask = kwargs.get("attn_mask")
            kind = None if mask is None else type(mask).__name__
            self.calls.append(
                (kind, bool(kwargs.get("is_causal")), q.shape[2], k.shape[2], k.shape[1])
            )
        return func(*args, **kwargs)


def _sdpa_calls(model: Any, ids: list[int], past: int) -> list:
    t = torch.tensor(ids)
    with torch.no_grad():
        leaves = run_segment(model, t[:past], past=[], start=0).kv
        with _SdpaCalls() as spy:
            run_segment(model, t[past:], past=leaves, start=past)
    return spy.calls


def test_a_past_no_longer_than_the_segment_runs_sdpa_causal_without_a_mask(
    model_dir: Path,
) -> None:
    # every layer: no mask, is_causal, the query padded to the keys' length (10 + 20), K/V not
    # repeated per query head (2 K/V heads)
    assert _sdpa_calls(_model(model_dir), list(range(8, 38)), 10) == [(None, True, 30, 30, 2)] * 2


def test_a_longer_past_runs_lower_right_causal(model_dir: Path) -> None:
    """A short segment on a long past: torch's lower-right CausalBias (CUDA's flash kernel takes
    it without a mask), not HF's mask and not a query padded to the whole past."""
    calls = _sdpa_calls(_model(model_dir), list(range(8, 38)), 20)
    assert calls == [("CausalBias", False, 10, 30, 4)] * 2


def test_a_padding_mask_is_built_by_hf() -> None:
    """Only a plain causal mask is dropped: padding (or any other mask) goes to HF's sdpa mask."""
    pad = torch.tensor([[False, True, True, True]])
    kw = {"batch_size": 1, "q_length": 4, "kv_length": 4, "device": "cpu"}
    assert causal_mask(attention_mask=torch.ones(1, 4, dtype=torch.bool), **kw) is None
    mask = causal_mask(attention_mask=pad, **kw)
    assert mask is not None and not bool(mask[0, 0, :, 0].any())  # nobody attends to the pad


def test_only_sdpa_models_are_switched(model_dir: Path) -> None:
    eager = LlamaForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager")
    assert not use_causal_kernel(eager)
    assert eager.config._attn_implementation == "eager"
