"""Accumulators over the trainable parameters, updated in place.

Why not one flat vector per source (the obvious way): flattening every source's gradients with
`torch.cat`, merging partial sums into new vectors and converting them between dtypes made
full-parameter vector work ~60% of the learner's time on SmolLM2-135M and kept ~20 full-size
vectors alive. Here every accumulator is one preallocated flat buffer (`accum_dtype`) seen through
per-parameter views, a source's gradients (as autograd returns them, one tensor per parameter)
are added into those views with fused multi-tensor adds, and buffers are recycled through a pool:
no per-source allocation, and a constant number of full-size vectors per open group (G1, G2) or
trajectory (its own sum).

Sums run in arrival order. Stream and sync apply a group's sources in the same ready order, so
they agree to the last bit in the equivalence replays; across runs whose arrival order differs,
sums agree to accumulator rounding (fp32: ~1e-7 relative; `accum_dtype: float64` for more).

Which sums a backward's gradients go into is `learner.routing`'s job.
"""

from __future__ import annotations

import ctypes
import functools
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from thundersync.learner.host_adds import parallel_add_


class FlatSpec:
    """The flat layout of a list of tensors: shapes, sizes, and per-tensor views of a buffer."""

    def __init__(self, tensors: Sequence[torch.Tensor], device: torch.device | str = "cpu") -> None:
        self.shapes = [t.shape for t in tensors]
        self.numels = [t.numel() for t in tensors]
        self.total = sum(self.numels)
        self.device = torch.device(device)

    def unflatten(self, vec: torch.Tensor) -> list[torch.Tensor]:
        out, i = [], 0
        for shape, n in zip(self.shapes, self.numels, strict=True):
            out.append(vec[i : i + n].view(shape))
            i += n
        return out


def add_into(
    dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor | None], alpha: float = 1.0
) -> None:
    """dst_i += alpha * src_i in place; None sources are skipped.

    Same dtype and device: one fused multi-tensor add. Otherwise (fp32 grads into a float64 sum)
    a per-tensor in-place add, which converts on the fly instead of allocating a converted copy.
    """
    pairs = [(a, b) for a, b in zip(dst, src, strict=True) if b is not None]
    if not pairs:
        return
    if all(a.dtype == b.dtype and a.device == b.device for a, b in pairs):
        d, s = [a for a, _ in pairs], [b for _, b in pairs]
        if alpha == 1.0:
            torch._foreach_add_(d, s)
        else:
            torch._foreach_add_(d, s, alpha=alpha)
        return
    for a, b in pairs:
        a.add_(b, alpha=alpha)


FreeLists = dict[tuple[int, torch.dtype], list[torch.Tensor]]


def free_lists() -> FreeLists:
    return defaultdict(list)


_CHUNK = 1 << 18


def _trim_host_heap(device: torch.device) -> None:
    """Return freed host heap pages to the OS (glibc keeps freed chunks resident otherwise, so
    a freed buffer's memory could not serve a larger one). No-op off glibc or for CUDA pools."""
    if device.type != "cpu":
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def add_in_place(
    dst: torch.Tensor, src: torch.Tensor, alpha: float, adders: ThreadPoolExecutor | None
) -> None:
    """dst += alpha * src; split over `adders` (bit for bit the same) when both are contiguous
    host tensors of one dtype, else one torch add."""
    same = src.dtype == dst.dtype and src.device == dst.device and dst.device.type == "cpu"
    if adders is not None and same and dst.is_contiguous() and src.is_contiguous():
        parallel_add_(dst, src, alpha, adders)
    else:
        dst.add_(src, alpha=alpha)


def add_flat(
    dst: torch.Tensor,
    src: torch.Tensor,
    alpha: float = 1.0,
    adders: ThreadPoolExecutor | None = None,
) -> None:
    """dst += alpha * src for flat vectors; across dtypes in cache-sized chunks (a whole-vector
    mixed-dtype add materialises a converted copy of src: 1.3 GB at 163M parameters)."""
    if dst.dtype == src.dtype:
        add_in_place(dst, src, alpha, adders)
        return
    for i in range(0, dst.numel(), _CHUNK):
        dst[i : i + _CHUNK].add_(src[i : i + _CHUNK], alpha=alpha)


def norm_f64(vec: torch.Tensor) -> float:
    """The 2-norm accumulated in float64, chunk by chunk: `vector_norm(fp32, dtype=float64)`
    converts the whole vector first (a 2x-size copy whose pages are faulted in: ~1 s at 163M
    parameters on CPU)."""
    if vec.dtype == torch.float64 or vec.numel() <= 8 * _CHUNK:
        return float(torch.linalg.vector_norm(vec, dtype=torch.float64))
    parts = [
        torch.linalg.vector_norm(vec[i : i + 8 * _CHUNK], dtype=torch.float64)
        for i in range(0, vec.numel(), 8 * _CHUNK)
    ]
    return float(torch.linalg.vector_norm(torch.stack(parts)))


def narrow_in_place(vec: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`vec` converted to the narrower `dtype` inside its own storage (fp64 -> fp32: the first half
    of the buffer), so the step's gradient costs no second full-size vector.

    Chunk by chunk through a small temporary: output element i lands on bytes that belonged to
    input elements < i/2 + 1, which were read before (this chunk into the temporary, the earlier
    chunks before it). `vec` is consumed.
    """
    if vec.dtype == dtype:
        return vec
    width = torch.empty((), dtype=dtype).element_size()
    if vec.element_size() % width or not vec.is_contiguous() or vec.dim() != 1:
        return vec.to(dtype)
    n = vec.numel()
    out = vec.view(dtype)[:n]
    for i in range(0, n, _CHUNK):
        out[i : i + _CHUNK].copy_(vec[i : i + _CHUNK].to(dtype))
    return out


class BufferPool:
    """Recycled flat buffers; `held_bytes` is what one engine's work holds right now.

    `shared` free lists outlive the engine (the learner keeps them across updates), so an
    update reuses the buffers the last one released instead of faulting in new pages.
    """

    def __init__(
        self,
        device: torch.device | str,
        shared: FreeLists | None = None,
        adders: ThreadPoolExecutor | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.adders = adders  # threads for host adds into these buffers (`learner.host_threads`)
        self._free: FreeLists = shared if shared is not None else free_lists()
        self.held_bytes = 0
        self.peak_held_bytes = 0
        self.allocations = 0

    def acquire(self, numel: int, dtype: torch.dtype, zero: bool = True) -> torch.Tensor:
        free = self._free[(numel, dtype)]
        if free:
            buf = free.pop()
            if zero:
                buf.zero_()
        else:
            # buffers of another size / dtype would sit idle beside the new one (the update's
            # float64 sum after fp32 group buffers: the peak of a short GRPO update): give
            # them back first, so the new buffer can take their memory
            self._drop_other_keys((numel, dtype))
            make = torch.zeros if zero else torch.empty
            buf = make(numel, dtype=dtype, device=self.device)
            self.allocations += 1
        self.track(buf.numel() * buf.element_size())
        return buf

    def drop_free(self) -> None:
        """Give the recycled buffers back to the allocator (before the step allocates)."""
        self._free.clear()  # (no trim: the step's allocations reuse the freed chunks as they are)

    def _drop_other_keys(self, key: tuple[int, torch.dtype]) -> None:
        others = [k for k, v in self._free.items() if k != key and v]
        for k in others:
            self._free[k].clear()
        if others:
            _trim_host_heap(self.device)

    def release(self, buf: torch.Tensor) -> None:
        self.track(-buf.numel() * buf.element_size())
        self._free[(buf.numel(), buf.dtype)].append(buf)

    def track(self, nbytes: int) -> None:
        """Count bytes the engine holds outside the pool (held gradients, K/V stores)."""
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)


class ParamSum:
    """sum_i w_i H_i over the parameters: one pooled flat buffer seen through per-parameter views.

    The buffer is not zero-filled when acquired: a parameter's first gradient is written (`copy`
    / `mul ... out=`) instead of added to zeros, which saves a full-size memset and a read per
    sum; `flat` zero-fills whatever no gradient reached before anyone reads the whole vector.
    """

    def __init__(self, spec: FlatSpec, pool: BufferPool, dtype: torch.dtype) -> None:
        self.spec = spec
        self.pool = pool
        self._buf = pool.acquire(spec.total, dtype, zero=False)
        self.views = spec.unflatten(self._buf)
        self._fresh = [True] * len(self.views)

    @property
    def flat(self) -> torch.Tensor:
        if any(self._fresh):
            for i, v in enumerate(self.views):
                if self._fresh[i]:
                    v.zero_()
                    self._fresh[i] = False
        return self._buf

    def add_one(self, i: int, g: torch.Tensor, w: float = 1.0) -> None:
        v = self.views[i]
        if self._fresh[i]:
            if w == 1.0:
                v.copy_(g)
            elif g.dtype == v.dtype and g.device == v.device:
                torch.mul(g, w, out=v)
            else:  # convert first, then scale in the sum's dtype (as add_ would)
                v.copy_(g).mul_(w)
            self._fresh[i] = False
        else:
            add_in_place(v, g, w, self.pool.adders)

    def add(self, grads: Sequence[torch.Tensor | None], alpha: float = 1.0) -> None:
        for i, g in enumerate(grads):
            if g is not None:
                self.add_one(i, g, alpha)

    def add_rows(self, i: int, index: torch.Tensor, rows: torch.Tensor, w: float = 1.0) -> None:
        """parameter i [index] += w * rows for unique `index` (an embedding's gradient, the rows
        it touched): the same `add_` per element as `add_one`, so both round alike."""
        v = self.views[i]
        if self._fresh[i]:
            v.zero_()
            self._fresh[i] = False
        sel = v.index_select(0, index)
        sel.add_(rows, alpha=w)
        v.index_copy_(0, index, sel)

    def add_vector(self, vec: torch.Tensor, alpha: float = 1.0) -> None:
        """+= alpha * vec for a flat vector (first write: a converting copy, no memset)."""
        if all(self._fresh):
            if vec.dtype == self._buf.dtype and alpha != 1.0:
                torch.mul(vec, alpha, out=self._buf)
            else:
                self._buf.copy_(vec)
                if alpha != 1.0:
                    self._buf.mul_(alpha)
            self._fresh = [False] * len(self.views)
            return
        add_flat(self.flat, vec, alpha, self.pool.adders)

    def free(self) -> None:
        self.pool.release(self._buf)
