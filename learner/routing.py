"""Where a backward's parameter gradients go: straight into the active sums, in place.

`GradRouter` holds one post-accumulate-grad hook per parameter; during a routed backward each
`p.grad` is added into every target sum (`sum += w * grad`) and dropped at once, so a source never
holds a full-size gradient vector. Custom autograd functions that can do better than a dense
`p.grad` (the embedding's rows, the LM head's dW in a reused buffer: `learner.routed_ops`) ask
`active_router()` and add through it directly.

On CUDA with host accumulators, gradients are copied on a side stream into a bounded pinned
staging ring before the host adds (`GradSink`); a full ring is drained (waited for and added) and
reused, so the pinned memory is a few of the largest gradients, not a second copy of the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from thundersync.learner.accumulators import FlatSpec, ParamSum

_ACTIVE: list[GradRouter] = []  # the router of the backward now running (backwards do not nest)
_CLAIM = "_tsrl_direct_grad"  # marks a parameter (a WeakSet would compare tensors elementwise)
_MIN_RING_BYTES = 256 * 2**20  # fewer drains per backward; small next to an 8B+ model


def ring_numel(largest: int, total: int, itemsize: int) -> int:
    """The staging ring's elements: room for two of the largest gradients (a drain then frees at
    least half of it), at least 256 MiB, at most the model; a power of two in bytes, as the
    pinned allocator rounds a block up to one anyway."""
    want = max(2 * largest * itemsize, _MIN_RING_BYTES)
    return min((1 << (want - 1).bit_length()) // itemsize, total)


def active_router() -> GradRouter | None:
    return _ACTIVE[-1] if _ACTIVE else None


def claim(p: torch.Tensor) -> None:
    """`p`'s gradient may come through a direct route: its forward ran a routed op."""
    setattr(p, _CLAIM, True)


def claimed(p: torch.Tensor) -> bool:
    return bool(getattr(p, _CLAIM, False))


class GradSink:
    """Brings a source's gradients to the accumulator device.

    Same device: the gradients themselves (no copy). Another device (CUDA -> host): copied into a
    staging ring (pinned for CUDA, on a side stream so the copy does not serialise with the
    compute stream's next kernels). A staged view is valid until `reset`; `stage` returns None
    when the ring has no room left: the caller drains (`wait`, adds, `reset`) and stages again.
    """

    def __init__(
        self,
        spec: FlatSpec,
        acc_device: torch.device,
        dtype: torch.dtype,
        ring: int | None = None,
    ) -> None:
        self.spec = spec
        self.acc_device = acc_device
        self.dtype = dtype
        self.ring = ring or ring_numel(max(spec.numels), spec.total, dtype.itemsize)
        self._buf: torch.Tensor | None = None
        self._at = 0
        self._stream: torch.cuda.Stream | None = None
        self.drains = 0

    def stage(self, g: torch.Tensor) -> torch.Tensor | None:
        """Start copying a gradient into the ring (see `wait`); None: the ring is full."""
        if self._buf is None:  # made at the first copy, reused by every source
            self._buf = torch.empty(self.ring, dtype=self.dtype, pin_memory=g.is_cuda)
            if g.is_cuda:
                self._stream = torch.cuda.Stream(device=g.device)
        n = g.numel()
        if n > self.ring:
            raise ValueError(f"a gradient of {n} elements exceeds the staging ring ({self.ring})")
        if self._at + n > self.ring:
            return None
        view = self._buf[self._at : self._at + n].view(g.shape)
        self._at += n
        stream = self._stream
        if stream is None:
            view.copy_(g)
            return view
        stream.wait_stream(torch.cuda.current_stream(g.device))
        with torch.cuda.stream(stream):
            view.copy_(g, non_blocking=True)
            g.record_stream(stream)
        return view

    def wait(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def reset(self) -> None:
        """The staged views are spent: the ring is free again."""
        self._at = 0


Target = tuple[ParamSum, float]  # (a sum, the weight its gradients get)


class GradRouter:
    """Adds each parameter's gradient into the active sums the moment autograd produces it.

    A post-accumulate-grad hook per parameter: during a routed backward, `p.grad` is added into
    every target (`sum_i += w * grad`) and dropped at once, so a source never holds a
    full-size gradient vector (autograd.grad would return all of them together). Outside a
    routed backward the hooks do nothing. Across devices (CUDA compute, host sums) the hook
    copies into the sink's staging ring; the adds run when it is full and when the backward ends.
    """

    def __init__(self, params: Sequence[torch.Tensor], sink: GradSink) -> None:
        self.sink = sink
        self._index = {id(p): i for i, p in enumerate(params)}
        self._targets: list[Target] | None = None
        self._staged: list[tuple[int, torch.Tensor]] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params]
        self._scratch: dict[int, torch.Tensor] = {}  # per parameter, kept across backwards
        self._pending: dict[int, torch.Tensor | list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.add_s = 0.0  # seconds in the adds into the sums (host work when they live there)

    # ---- direct routes (learner.routed_ops): during a routed backward only -----------------
    # A claimed parameter's contributions to one backward (the head's dW, embedding rows, a
    # p.grad autograd still forms for it) are gathered and added into the sums once, at the
    # end: a source's gradient H_i is one value per element before it is weighted, as autograd's
    # dense p.grad was. Weighting its pieces apart (r a + r b, not r (a + b)) would make a
    # gradient held for its reward round differently from one weighted at once.
    def routes(self, p: torch.Tensor) -> bool:
        """Whether `p`'s gradient can go into the active sums directly right now (host sums)."""
        return (
            self._targets is not None
            and id(p) in self._index
            and claimed(p)
            and p.device == self.sink.acc_device
        )

    def dense(self, p: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
        """p's gradient buffer for this backward (a reused scratch: no new pages) and whether it
        is empty (the caller writes it with `out=`) or holds earlier contributions (add)."""
        i = self._index[id(p)]
        got = self._pending.get(i)
        if isinstance(got, torch.Tensor):
            return got, False
        buf = self._scratch.get(i)
        if buf is None or buf.dtype != dtype:
            buf = self._scratch[i] = torch.empty(p.shape, dtype=dtype, device=p.device)
        self._pending[i] = buf
        if got is not None:  # rows came first: they become dense
            buf.zero_()
            self._rows_into(buf, got)
            return buf, False
        return buf, True

    def add_rows(self, p: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> None:
        """p.grad[index] += rows (an embedding lookup's backward), gathered for this backward."""
        i = self._index[id(p)]
        got = self._pending.get(i)
        if isinstance(got, torch.Tensor):
            got.index_add_(0, index, rows.to(got.dtype))
        elif got is None:
            self._pending[i] = [(index, rows)]
        else:
            got.append((index, rows))

    @staticmethod
    def _rows_into(buf: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for index, rows in parts:
            buf.index_add_(0, index, rows.to(buf.dtype))

    def _add(self, targets: list[Target], i: int, g: torch.Tensor) -> None:
        t0 = time.perf_counter()
        for target, w in targets:
            target.add_one(i, g, w)
        self.add_s += time.perf_counter() - t0

    def _flush(self, targets: list[Target]) -> None:
        for i, got in self._pending.items():
            if isinstance(got, torch.Tensor):
                self._add(targets, i, got)
                continue
            index = torch.cat([ix for ix, _ in got])
            rows = torch.cat([r for _, r in got])
            uniq, inverse = torch.unique(index, return_inverse=True)
            compact = torch.zeros(len(uniq), rows.shape[1], dtype=rows.dtype, device=rows.device)
            compact.index_add_(0, inverse, rows)  # H_i's touched rows, one value per element
            t0 = time.perf_counter()
            for target, w in targets:
                target.add_rows(i, uniq, compact, w)
            self.add_s += time.perf_counter() - t0
        self._pending.clear()

    def _hook(self, p: torch.Tensor) -> None:
        if self._targets is None or p.grad is None:
            return
        i = self._index[id(p)]
        g = p.grad
        p.grad = None
        if g.device != self.sink.acc_device:
            view = self.sink.stage(g)
            if view is None:  # the ring is full: add what it holds, then it is free again
                self._drain(self._targets)
                view = self.sink.stage(g)
                assert view is not None
            self._staged.append((i, view))
            return
        if claimed(p):  # joins the direct routes' part of this backward
            buf, empty = self.dense(p, g.dtype)
            if empty:
                buf.copy_(g)
            else:
                buf.add_(g)
            return
        self._add(self._targets, i, g)

    def backward(
        self,
        targets: list[Target],
        outputs: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor] | None = None,
        *,
        inputs: Sequence[torch.Tensor],
        retain_graph: bool = False,
    ) -> None:
        self._targets = targets
        _ACTIVE.append(self)
        try:
            torch.autograd.backward(
                list(outputs),
                grad_tensors=list(grad_outputs) if grad_outputs is not None else None,
                inputs=list(inputs),
                retain_graph=retain_graph,
            )
            self._flush(targets)
            self._drain(targets)
        finally:
            _ACTIVE.pop()
            self._targets = None
            self._pending.clear()
            self._staged = []
            self.sink.reset()

    def _drain(self, targets: list[Target]) -> None:
        """Wait for the staged copies, add them into the sums and free the ring."""
        if not self._staged:
            return
        self.sink.wait()
        for i, g in self._staged:
            self._add(targets, i, g)
        self._staged = []
        self.sink.reset()
        self.sink.drains += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
