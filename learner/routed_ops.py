"""The [V, d] matrices' gradients (embedding, LM head) routed straight into the sums, on CPU.

Why not let autograd form them: a plain backward materialises full [V, d] gradients every time.
The embedding's dense backward zero-fills one, the head's dW is another, and a tied model sums
the two into p.grad. On CPU each is a fresh allocation that glibc serves from mmap (it is above
the 32 MB mmap threshold), so every backward pays page faults on ~3 x 113 MB at SmolLM2 sizes.
The streamed learner runs one backward per source where a textbook learner runs one per batch,
so this cost is multiplied by the group size and made the learner slower than the textbook one.

Here, during a routed backward (`GradRouter.backward`) with host compute:
- the embedding's gradient is handed over as the rows it touches (summed per token with
  `index_add_`, sequential and deterministic on CPU; the padding row gets none, as in nn.Embedding);
- the head's dW is formed in a scratch buffer the router keeps per parameter (`logprobs`).
Either way a parameter's contributions to one backward are gathered and added into the sums once
(`GradRouter`), so a source's gradient is one value per element before it is weighted.
Outside a routed backward both fall back to what autograd does. CUDA keeps the plain path: its
caching allocator reuses memory, and an atomic `index_add_` would not be deterministic there.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from torch import nn

from thundersync.learner.routing import active_router, claim


class _RoutedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None
    ) -> torch.Tensor:
        claim(weight)
        ctx.save_for_backward(ids)
        ctx.padding_idx = padding_idx
        ctx.weight_ref = weight  # only to find the parameter's sums; nothing is read from it
        ctx.vocab = weight.shape[0]
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        index = ids.reshape(-1)
        rows = grad.reshape(index.numel(), -1)
        if ctx.padding_idx is not None:
            keep = index != ctx.padding_idx
            index, rows = index[keep], rows[keep]
        weight = ctx.weight_ref
        router = active_router()
        if router is not None and router.routes(weight):
            router.add_rows(weight, index, rows)
            return None, None, None
        dense = torch.zeros(ctx.vocab, rows.shape[1], dtype=grad.dtype, device=grad.device)
        return None, dense.index_add_(0, index, rows), None


def routable_embedding(module: object) -> TypeGuard[nn.Embedding]:
    """An nn.Embedding whose gradient the router can take as rows (host compute, plain lookup)."""
    return (
        isinstance(module, nn.Embedding)
        and type(module) is nn.Embedding
        and module.weight.requires_grad
        and module.weight.device.type == "cpu"
        and module.max_norm is None
        and not module.scale_grad_by_freq
        and not module.sparse
        and torch.is_grad_enabled()
    )


def routed_embedding(module: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _RoutedEmbedding.apply(ids, module.weight, module.padding_idx)
    return out
