"""Host-side accumulators over a flat view of the trainable parameters.

Gradients from autograd are flattened into one vector in a fixed parameter order, so the G1 / G2
pair of a group, a held gradient, and the update's running sum are plain 1-D tensors
(`accum_dtype`, fp32 by default) on the accumulator device: the host (`learner.accum_device:
host`, pinned memory when the learner runs on CUDA) or the learner's device. The flat order is the
order of `params`, identical on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class FlatSpec:
    def __init__(self, tensors: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> None:
        self.shapes = [t.shape for t in tensors]
        self.numels = [t.numel() for t in tensors]
        self.total = sum(self.numels)
        self.device = torch.device(device)

    def flatten(self, tensors: Sequence[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        """One vector on the accumulator device (concatenated where the gradients are)."""
        parts = []
        src = next((t.device for t in tensors if t is not None), self.device)
        for t, n in zip(tensors, self.numels, strict=True):
            parts.append(
                torch.zeros(n, dtype=dtype, device=src) if t is None else t.reshape(-1).to(dtype)
            )
        flat = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=src)
        return flat.to(self.device)

    def unflatten(self, vec: torch.Tensor) -> list[torch.Tensor]:
        out, i = [], 0
        for shape, n in zip(self.shapes, self.numels, strict=True):
            out.append(vec[i : i + n].view(shape))
            i += n
        return out


class UpdateAccumulator:
    """The update's unnormalised gradient sum plus the counts its normaliser needs."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        pin = device.type == "cpu" and torch.cuda.is_available()  # fast copies to and from CUDA
        self.grad = torch.zeros(numel, dtype=dtype, device=device, pin_memory=pin)
        self.groups_closed = 0
        self.scored_tokens = 0

    def add(self, vec: torch.Tensor, scale: float = 1.0) -> None:
        if scale == 1.0:
            self.grad += vec
        else:
            self.grad.add_(vec, alpha=scale)


class OrderedSum:
    """Sum of n indexed vectors in a fixed pairwise order, whatever order they arrive in.

    Arrival order differs between schedules (and between runs of the stream schedule), and fp32
    addition is not associative; Adam then turns those last-bit differences in near-zero gradient
    coordinates into visible parameter gaps. A fixed binary tree over the indices makes the sum
    bitwise independent of arrival order without waiting: a vector is added to its sibling as soon
    as both exist, so at most O(log n) partial sums plus not-yet-paired leaves are held.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("OrderedSum needs n >= 1")
        self.n = n
        self._parent: dict[tuple[int, int], tuple[int, int]] = {}
        self._sibling: dict[tuple[int, int], tuple[int, int]] = {}
        self._build(0, n)
        self._done: dict[tuple[int, int], torch.Tensor] = {}
        self._seen: set[int] = set()

    def _build(self, lo: int, hi: int) -> None:
        if hi - lo <= 1:
            return
        mid = (lo + hi) // 2
        left, right = (lo, mid), (mid, hi)
        for child in (left, right):
            self._parent[child] = (lo, hi)
        self._sibling[left], self._sibling[right] = right, left
        self._build(lo, mid)
        self._build(mid, hi)

    def add(self, index: int, vec: torch.Tensor) -> None:
        if not 0 <= index < self.n or index in self._seen:
            raise ValueError(f"index {index} is out of range or was already added")
        self._seen.add(index)
        node, val = (index, index + 1), vec
        while node in self._sibling and self._sibling[node] in self._done:
            sib = self._sibling[node]
            other = self._done.pop(sib)
            val = val + other if node < sib else other + val  # left + right, always
            node = self._parent[node]
        self._done[node] = val

    @property
    def complete(self) -> bool:
        return (0, self.n) in self._done

    def result(self) -> torch.Tensor:
        if not self.complete:
            raise ValueError(f"{self.n - len(self._seen)} of {self.n} terms are still missing")
        return self._done[(0, self.n)]

    @property
    def held(self) -> int:
        return len(self._done)
