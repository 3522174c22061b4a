"""Direct gradient routes (embedding rows, the head's dW in a reused buffer) and the chunked clip
norm: each checked against plain torch (a textbook forward + backward, a float64 norm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from thundersync.hf_models import load_model
from thundersync.learner.accumulators import BufferPool, FlatSpec, ParamSum, norm_f64
from thundersync.learner.boundary import run_segment
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.routing import GradRouter, GradSink, claimed, ring_numel


def _model(tiny_model_dir: Path, tied: bool) -> nn.Module:
    model = load_model(tiny_model_dir)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
        model.config.tie_word_embeddings = True
    return model.eval()


def _ids_with_pad_and_repeats(model: nn.Module) -> torch.Tensor:
    pad = model.model.embed_tokens.padding_idx
    assert pad is not None  # the tiny model's tokenizer has a pad token
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(8, model.config.vocab_size, (23,), generator=g)
    ids[[3, 9, 15]] = pad
    ids[[4, 10, 16, 20]] = 11  # one token seen four times: its rows are summed
    return ids


def _textbook_grads(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids.view(1, -1)).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
    (lp * mask).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("tied", [False, True])
def test_routed_embedding_and_head_gradients_equal_a_textbook_backward(
    tiny_model_dir: Path, tied: bool
) -> None:
    model = _model(tiny_model_dir, tied)
    ids = _ids_with_pad_and_repeats(model)
    mask = (torch.arange(len(ids) - 1) % 3 != 0).float()
    want = _textbook_grads(model, ids, mask)

    params = [p for p in model.parameters() if p.requires_grad]
    spec = FlatSpec(params)
    router = GradRouter(params, GradSink(spec, torch.device("cpu"), torch.float32))
    target = ParamSum(spec, BufferPool("cpu"), torch.float32)
    out = run_segment(model, ids, past=[], start=0)
    lp = scored_logprobs(model, out.hidden, ids, mask.bool())
    router.backward([(target, 1.0)], [lp.sum()], inputs=params)
    router.remove()
    assert claimed(model.model.embed_tokens.weight) and claimed(model.lm_head.weight)
    assert all(p.grad is None for p in params)  # nothing dense was left behind
    got = spec.unflatten(target.flat)
    for w, g in zip(want, got, strict=True):  # fp32 rounding of a different summation order
        assert float((g - w).abs().max()) <= 1e-6 * float(w.abs().max())
    emb = [i for i, p in enumerate(params) if p is model.model.embed_tokens.weight][0]
    pad = model.model.embed_tokens.padding_idx
    if not tied:  # nn.Embedding gives its padding row no gradient; the routed rows skip it too
        assert torch.count_nonzero(got[emb][pad]) == 0
    assert torch.count_nonzero(got[emb][11]) > 0


def _parts(n: int, k: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    scale = 10.0 ** torch.randint(-6, 6, (n,), generator=g).float()
    return [torch.randn(n, generator=g) * scale for _ in range(k)]


def test_norm_accumulated_in_chunks_equals_a_float64_norm() -> None:
    v = _parts(3_000_001, 1)[0]
    want = float(torch.linalg.vector_norm(v.double()))
    assert norm_f64(v) == pytest.approx(want, rel=1e-13)


def _staged_sum(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, ring: int | None):
    """A routed backward whose sums sit on another device than the gradients (`cpu:0` vs `cpu`:
    the cross-device staging path a CUDA learner with host sums takes, runnable on CPU)."""
    params = [p for p in model.parameters() if p.requires_grad]
    spec = FlatSpec(params)
    sink = GradSink(spec, torch.device("cpu", 0), torch.float32, ring=ring)
    router = GradRouter(params, sink)
    target = ParamSum(spec, BufferPool("cpu"), torch.float32)
    out = run_segment(model, ids, past=[], start=0)
    lp = scored_logprobs(model, out.hidden, ids, mask.bool())
    router.backward([(target, 1.0)], [lp.sum()], inputs=params)
    router.remove()
    return spec.unflatten(target.flat), sink.drains


def test_a_full_staging_ring_is_drained_and_reused_without_losing_a_gradient(
    tiny_model_dir: Path,
) -> None:
    """The bounded staging ring: when the next gradient does not fit, what is staged is added and
    the ring starts over. A ring of two of the largest gradients drains several times per backward
    and gives the same sums as a ring holding the whole model (one drain at the end)."""
    model = _model(tiny_model_dir, tied=False)
    ids = _ids_with_pad_and_repeats(model)
    mask = (torch.arange(len(ids) - 1) % 3 != 0).float()
    params = [p for p in model.parameters() if p.requires_grad]
    largest = max(p.numel() for p in params)
    whole, one = _staged_sum(model, ids, mask, ring=sum(p.numel() for p in params))
    small, many = _staged_sum(model, ids, mask, ring=2 * largest)
    assert one == 1 and many > 2, f"drains: whole ring {one}, small ring {many}"
    for a, b in zip(whole, small, strict=True):
        assert torch.equal(a, b)
    want = _textbook_grads(model, ids, mask)
    for w, g in zip(want, small, strict=True):
        assert float((g - w).abs().max()) <= 1e-6 * float(w.abs().max())


def test_staging_ring_size_is_bounded_by_the_largest_gradient_not_the_model() -> None:
    """Qwen3-32B-like sizes: the ring is a power of two in bytes, holds two of the largest
    gradients, is at least 256 MiB and never more than the model."""
    largest, total = 151_936 * 5_120, 32_762_123_264  # embedding rows x hidden; all parameters
    elems = ring_numel(largest, total, 4)
    nbytes = elems * 4
    assert nbytes & (nbytes - 1) == 0
    assert 2 * largest <= elems < 4 * largest
    assert nbytes < total * 4 / 10
    assert ring_numel(10, 1000, 4) == 1000  # a tiny model: the whole model, not 256 MiB
    assert ring_numel(1000, 10**9, 4) * 4 == 256 * 2**20
