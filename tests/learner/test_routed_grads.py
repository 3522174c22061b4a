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
from thundersync.learner.routing import GradRouter, GradSink, claimed


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
