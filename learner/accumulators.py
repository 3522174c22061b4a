"""Host-side accumulators over a flat view of the trainable parameters.

Gradients from autograd are flattened into one vector in a fixed parameter order, so the G1 / G2
pair of a group, a held gradient, and the update's running sum are plain 1-D tensors on the CPU
(`accum_dtype`, fp32 by default). The flat order is the order of `params`, identical on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class FlatSpec:
    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.shapes = [t.shape for t in tensors]
        self.numels = [t.numel() for t in tensors]
        self.total = sum(self.numels)

    def flatten(self, tensors: Sequence[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        parts = []
        for t, n in zip(tensors, self.numels, strict=True):
            parts.append(torch.zeros(n, dtype=dtype) if t is None else t.reshape(-1).to(dtype))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

    def unflatten(self, vec: torch.Tensor) -> list[torch.Tensor]:
        out, i = [], 0
        for shape, n in zip(self.shapes, self.numels, strict=True):
            out.append(vec[i : i + n].view(shape))
            i += n
        return out


class UpdateAccumulator:
    """The update's unnormalised gradient sum plus the counts its normaliser needs."""

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.grad = torch.zeros(numel, dtype=dtype)
        self.groups_closed = 0
        self.scored_tokens = 0

    def add(self, vec: torch.Tensor, scale: float = 1.0) -> None:
        if scale == 1.0:
            self.grad += vec
        else:
            self.grad.add_(vec, alpha=scale)
