"""One growing per-layer K/V store (and adjoint ledger) per open OPD trajectory.

Why: turn j runs on the K/V of turns 0..j-1 as leaves. Re-concatenating every earlier turn's
K/V at each turn copies O(pos) per layer twice and keeps a copy per turn (per-turn cost and
memory rising with the turn index). Here the K/V live in one buffer per layer that grows by
doubling; turn j's past is a zero-copy view of its first `pos` positions, made a leaf, and the
adjoint of that leaf is added into the same positions of a ledger buffer. Turn j's own K/V are
written behind it after the turn ran. Memory is linear in the trajectory's length.
The add happens in each leaf's post-accumulate-grad hook, which frees the leaf's grad at once: a
backward holds one layer's [past]-sized adjoint at a time, not every layer's. The hook finds the
ledger buffer through the store when it fires, so a leaf made before a regrowth (a kept turn
graph, backpropagated at close) adds into the current buffer, not the one replaced.
Bounded for the plan: growth stops at `limit` (the run's `rollout.max_total_tokens`) unless a turn
needs more, and buffers are regrown one layer at a time (old + new for one layer, not for all).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from thundersync.learner.accumulators import BufferPool
from thundersync.learner.boundary import KV


def _alias(buf: torch.Tensor, upto: int) -> torch.Tensor:
    """buf[:, :, :upto] as a leaf with its own version counter.

    A plain view shares the store's counter, so writing the next turn's K/V behind it would
    invalidate every saved view (activation checkpointing saves its inputs). The positions below
    `upto` are never written again, so aliasing them is safe.
    """
    view = buf[:, :, :upto]
    out = torch.empty(0, dtype=buf.dtype, device=buf.device)
    out.set_(buf.untyped_storage(), view.storage_offset(), view.shape, view.stride())
    return out.requires_grad_(True)


class KVStore:
    def __init__(
        self, pool: BufferPool, ledger_dtype: torch.dtype | None = None, limit: int | None = None
    ) -> None:
        self.pool = pool
        self.ledger_dtype = ledger_dtype
        self.limit = limit  # positions the store grows to at most (more only if a turn needs it)
        self.length = 0
        self.kv: list[list[torch.Tensor]] = []  # per layer [K, V], shape [B, H, cap, D]
        self.ledger: list[list[torch.Tensor]] = []  # same layout, the adjoints (fp32)
        self._bytes = 0

    @property
    def capacity(self) -> int:
        return self.kv[0][0].shape[2] if self.kv else 0

    def past(self, upto: int) -> list[KV]:
        """Leaves for positions 0..upto-1 (views of the store: no copy); a backward through them
        adds their adjoints into ledger[:, :, :upto] (`_route`), their `.grad` stays None."""
        if upto > self.length:
            raise ValueError(f"the store holds {self.length} positions, not {upto}")
        out = []
        for layer, (k, v) in enumerate(self.kv):
            kl, vl = _alias(k, upto), _alias(v, upto)
            kl.register_post_accumulate_grad_hook(partial(self._route, layer, 0))
            vl.register_post_accumulate_grad_hook(partial(self._route, layer, 1))
            out.append((kl, vl))
        return out

    def _route(self, layer: int, slot: int, leaf: torch.Tensor) -> None:
        """A past leaf's accumulated grad into the ledger current now, then freed."""
        if leaf.grad is not None:
            self.ledger[layer][slot][:, :, : leaf.shape[2]].add_(leaf.grad)
            leaf.grad = None

    def append(self, own: Sequence[KV]) -> None:
        """Write a turn's own K/V (detached) behind what the store holds."""
        n = own[0][0].shape[2]
        self._reserve(self.length + n, own)
        with torch.no_grad():
            for (k, v), (sk, sv) in zip(own, self.kv, strict=True):
                sk[:, :, self.length : self.length + n].copy_(k)
                sv[:, :, self.length : self.length + n].copy_(v)
        self.length += n

    def adjoint(self, start: int, stop: int) -> list[torch.Tensor]:
        return [buf[:, :, start:stop] for layer in self.ledger for buf in layer]

    def _reserve(self, need: int, like: Sequence[KV]) -> None:
        if need <= self.capacity:
            return
        grown = max(2 * self.capacity, 16)
        cap = max(need, min(grown, self.limit) if self.limit else grown)
        for layer, (k, v) in enumerate(like):  # one layer at a time: the old one freed at once
            row, lrow = [], []
            for slot, t in enumerate((k, v)):
                shape = (t.shape[0], t.shape[1], cap, t.shape[3])
                new = torch.zeros(shape, dtype=t.dtype, device=t.device)
                ldt = self.ledger_dtype or torch.promote_types(t.dtype, torch.float32)
                lnew = torch.zeros(shape, dtype=ldt, device=t.device)
                if layer < len(self.kv):
                    new[:, :, : self.length].copy_(self.kv[layer][slot][:, :, : self.length])
                    lnew[:, :, : self.length].copy_(self.ledger[layer][slot][:, :, : self.length])
                row.append(new)
                lrow.append(lnew)
            if layer < len(self.kv):
                self.kv[layer], self.ledger[layer] = row, lrow
            else:
                self.kv.append(row)
                self.ledger.append(lrow)
        nbytes = sum(t.numel() * t.element_size() for layer in self.kv + self.ledger for t in layer)
        self.pool.track(nbytes - self._bytes)
        self._bytes = nbytes

    def free(self) -> None:
        self.pool.track(-self._bytes)
        self._bytes = 0
        self.kv, self.ledger = [], []
