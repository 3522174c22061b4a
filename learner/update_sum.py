"""The update's gradient sum: float64 exactness without a new full-size float64 buffer.

The update sums closed group directions / trajectory sums (fp32 buffers) in float64, so the
result does not depend on the order groups close in (sync closes them one by one, stream as they
finish). The obvious float64 buffer is a new 8-bytes-per-parameter allocation at every update:
on CPU its pages are faulted in afresh each time (~0.9 s at 163M parameters, the largest cost
streaming added over a textbook learner there). A compensated fp32 pair in the parts' own
buffers was tried: about 48 bits against fp64's 53, and a 2-rank run then differed from its
1-rank replay after AdamW (OPD 1e-5).

So on one process the float64 sum lives in the two fp32 buffers already resident when the second
part arrives (`SplitF64`): for every chunk of `_CHUNK` elements, the float64 values of its first
half are stored in the first buffer's bytes of that chunk, those of its second half in the second
buffer's. A chunk's values are read into a small scratch, updated in float64 and written back to
the bytes they came from, so every value is exactly the float64 the plain buffer would hold, and
`finish` (divide, norm, narrow to the step's dtype) gives the same bits as the plain path: both go
through `finish_blocks`. Ranks > 1 reduce inside it, one float64 bucket at a time as it is read,
and write the narrowed result into their own buffers: no widened 8N vector (`_finish_reduced`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thundersync.learner.accumulators import (
    BufferPool,
    FlatSpec,
    ParamSum,
    narrow_in_place,
    norm_f64,
)

_CHUNK = 1 << 18  # the split layout's unit (elements); even, so every chunk halves exactly
_BLOCK = _CHUNK  # the norm's unit (cache-sized): partial norms are combined in this fixed order


def finish_blocks(
    n: int,
    read: Callable[[int, int, torch.Tensor], None],
    write: Callable[[int, int, torch.Tensor], None],
    normaliser: float,
    reduce: Callable[[torch.Tensor], None] | None = None,
    bucket: int = _BLOCK,
) -> float:
    """For each block: float64 values -> / -normaliser -> partial norm -> written narrowed.

    `read(i0, i1, out)` fills `out` with the float64 values of elements [i0, i1); `write(i0,
    i1, vals)` stores them in the step's dtype. Blocks go front to back, each read whole before
    it is written, so a narrowing written into the same storage never overwrites unread values.
    `reduce(vals)` (ranks > 1) sums a read bucket of `bucket` elements over the ranks in place
    before it is used: the whole float64 sum is never materialised. Returns the 2-norm,
    accumulated per `_BLOCK` in float64 (the same order for every layout and bucket size).
    """
    step = _BLOCK if reduce is None else max(_BLOCK, bucket - bucket % _BLOCK)
    scratch = torch.empty(min(n, step), dtype=torch.float64)
    parts = []
    for b0 in range(0, n, step):
        b1 = min(n, b0 + step)
        vals = scratch[: b1 - b0]
        read(b0, b1, vals)
        if reduce is not None:
            reduce(vals)
        vals.div_(-normaliser)  # loss = -objective: descend on the negated ascent direction
        for i0 in range(0, b1 - b0, _BLOCK):
            block = vals[i0 : i0 + _BLOCK]
            parts.append(torch.linalg.vector_norm(block, dtype=torch.float64))
        write(b0, b1, vals)
    return float(torch.linalg.vector_norm(torch.stack(parts))) if parts else 0.0


_Read = Callable[[int, int, torch.Tensor], None]


def _in_place(vec: torch.Tensor, target: torch.dtype) -> tuple[torch.Tensor, _Read]:
    """`vec`'s own storage seen as `target` (no wider than vec) for the result, and its reader."""

    def read(i0: int, i1: int, dst: torch.Tensor) -> None:
        dst.copy_(vec[i0:i1])

    return vec.view(target)[: vec.numel()], read


def _narrow_into(
    out: torch.Tensor,
    read: _Read,
    normaliser: float,
    reduce: Callable[[torch.Tensor], None] | None = None,
    bucket: int = _BLOCK,
) -> float:
    """`finish_blocks` writing the narrowed result into `out`; the norm."""

    def write(i0: int, i1: int, vals: torch.Tensor) -> None:
        out[i0:i1].copy_(vals)

    return finish_blocks(out.numel(), read, write, normaliser, reduce, bucket)


class SplitF64:
    """A float64 vector of `n` elements stored in two fp32 buffers of `n` elements each.

    Elements [c, c + L) of a chunk: the first L/2 as float64 in `lo`'s fp32 slots [c, c + L),
    the rest in `hi`'s (once packed). An odd last element is kept in `tail`.
    """

    def __init__(self, a: ParamSum, b: ParamSum) -> None:
        """The exact float64 a + b over a's and b's own buffers (which it now owns).

        Until a third term arrives the buffers keep a and b as they are and `read` adds them on
        the fly: an update of two parts is finished in one pass, with the same values.
        """
        self.parts = (a, b)
        self.lo, self.hi = a.flat, b.flat
        n = self.lo.numel()
        self.n, self.even = n, n - n % 2
        self.tail = torch.zeros(n - self.even, dtype=torch.float64)
        if self.tail.numel():
            self.tail[0] = float(self.lo[-1]) + float(self.hi[-1])
        self._scratch = torch.empty(min(self.even, _CHUNK), dtype=torch.float64)
        self._other = torch.empty_like(self._scratch)
        self.packed = False

    def _pack(self) -> None:
        for c0 in range(0, self.even, _CHUNK):
            c1 = min(self.even, c0 + _CHUNK)
            s = self._scratch[: c1 - c0]
            self._sum_pair(c0, c1, s)  # both chunks are read whole before they are written over
            self._store(c0, c1, s)
        self.packed = True

    def _sum_pair(self, c0: int, c1: int, out: torch.Tensor) -> None:
        out.copy_(self.lo[c0:c1])
        other = self._other[: c1 - c0]
        other.copy_(self.hi[c0:c1])  # a mixed-dtype add_ would convert into a new temporary
        out.add_(other)

    def _halves(self, c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lo[c0:c1].view(torch.float64), self.hi[c0:c1].view(torch.float64)

    def _load(self, c0: int, c1: int, out: torch.Tensor) -> None:
        lo, hi = self._halves(c0, c1)
        h = (c1 - c0) // 2
        out[:h].copy_(lo)
        out[h:].copy_(hi)

    def _store(self, c0: int, c1: int, vals: torch.Tensor) -> None:
        lo, hi = self._halves(c0, c1)
        h = (c1 - c0) // 2
        lo.copy_(vals[:h])
        hi.copy_(vals[h:])

    def add(self, vec: torch.Tensor) -> None:
        """+= vec (an fp32 flat vector), each element as the plain float64 buffer's add_ would."""
        if not self.packed:
            self._pack()
        for c0 in range(0, self.even, _CHUNK):
            c1 = min(self.even, c0 + _CHUNK)
            s = self._scratch[: c1 - c0]
            self._load(c0, c1, s)
            other = self._other[: c1 - c0]
            other.copy_(vec[c0:c1])
            s.add_(other)
            self._store(c0, c1, s)
        if self.tail.numel():
            self.tail.add_(vec[-1:])

    def read(self, i0: int, i1: int, out: torch.Tensor) -> None:
        """Elements [i0, i1) as float64 into `out` (i0 on a chunk boundary)."""
        get = self._load if self.packed else self._sum_pair
        for c0 in range(i0, min(i1, self.even), _CHUNK):
            c1 = min(i1, self.even, c0 + _CHUNK)
            get(c0, c1, out[c0 - i0 : c1 - i0])
        if i1 > self.even:
            out[self.even - i0 :].copy_(self.tail)

    def to_plain(self, dst: torch.Tensor) -> None:
        """The values into a plain float64 vector."""
        self.read(0, self.n, dst)

    def free(self) -> None:
        for p in self.parts:
            p.free()


class UpdateAccumulator:
    """The update's unnormalised gradient sum plus the counts its normaliser needs.

    Closed group directions / trajectory sums are handed over (`take`), not copied. The first is
    kept as it is (no new vector: while the next group runs, the update holds one vector); the
    second and later ones are summed in float64 (`SplitF64`; a plain float64 vector once ranks
    reduce): a single fp64 add of two fp32 vectors is exact-rounded and commutative, and more
    terms differ only at fp64 rounding.
    """

    def __init__(self, spec: FlatSpec, pool: BufferPool, dtype: torch.dtype) -> None:
        self.spec, self.pool, self.dtype = spec, pool, dtype
        self._first: ParamSum | None = None
        self._split: SplitF64 | None = None
        self._sum: ParamSum | None = None
        self._spare: ParamSum | None = None
        self.groups_closed = 0
        self.scored_tokens = 0

    def take(self, part: ParamSum) -> None:
        """Add a closed group's / trajectory's sum; the accumulator owns (and frees) it."""
        if self._first is None and self._split is None and self._sum is None:
            self._first = part
            return
        if self._sum is not None:
            self._sum.add_vector(part.flat)
            part.free()
        elif self._split is not None:
            self._split.add(part.flat)
            part.free()
        elif self._splittable(part):
            assert self._first is not None
            self._split, self._first = SplitF64(self._first, part), None
        else:
            self.widen()
            self.take(part)

    def _splittable(self, part: ParamSum) -> bool:
        first = self._first
        return (
            self.dtype == torch.float64
            and first is not None
            and all(p.flat.dtype == torch.float32 for p in (first, part))
            and all(p.flat.device.type == "cpu" for p in (first, part))
        )

    def widen(self) -> None:
        """Hold the sum as a plain vector in the accumulator dtype (ranks all-reduce it)."""
        if self._sum is not None:
            return
        first = self._first
        if first is not None and first.flat.dtype == self.dtype:  # a float64 part: adopt it
            self._sum, self._first = first, None
            return
        self._sum = ParamSum(self.spec, self.pool, self.dtype)
        if self._split is not None:
            dst = self._sum.flat
            self._split.to_plain(dst)
            self._split.free()
            self._split = None
        elif self._first is not None:
            self._sum.add_vector(self._first.flat)
            self._first.free()
            self._first = None

    @property
    def grad(self) -> torch.Tensor:
        """The unnormalised sum as one vector (a plain float64 one once two parts are in)."""
        if self._sum is None and self._split is None and self._first is not None:
            return self._first.flat
        self.widen()
        assert self._sum is not None
        return self._sum.flat

    def finish(
        self,
        normaliser: float,
        out_dtype: torch.dtype | None,
        reduce: Callable[[torch.Tensor], None] | None = None,
        bucket: int = _BLOCK,
    ) -> tuple[torch.Tensor, float]:
        """The step's gradient, -sum / normaliser in `out_dtype` (None: the sum's own), and its
        2-norm in float64; in the sum's own storage (the accumulator is consumed). `reduce`
        (ranks > 1): sums a float64 bucket of `bucket` elements over the ranks in place."""
        if reduce is not None:
            return self._finish_reduced(normaliser, out_dtype, reduce, bucket)
        if self._split is not None and out_dtype == torch.float32:
            out, read = self._take_split(out_dtype)
            return out, _narrow_into(out, read, normaliser)
        vec = self.grad
        if vec.dtype != torch.float64:  # one part, in its own (fp32) dtype
            grad = vec.div_(-normaliser)
            norm = norm_f64(grad)
            return (narrow_in_place(grad, out_dtype) if out_dtype else grad), norm
        target = out_dtype or vec.dtype
        if target.itemsize > vec.itemsize or not vec.is_contiguous():
            grad = vec.div_(-normaliser)
            return grad.to(target), norm_f64(grad)
        out, read = _in_place(vec, target)
        return out, _narrow_into(out, read, normaliser)

    def _finish_reduced(
        self,
        normaliser: float,
        out_dtype: torch.dtype | None,
        reduce: Callable[[torch.Tensor], None],
        bucket: int,
    ) -> tuple[torch.Tensor, float]:
        """finish() summed over the ranks bucket by bucket, each bucket reduced as it is read; the
        result narrowed into this rank's own buffers. Elementwise the same sums as reducing the
        widened vector first, so the same bits; every rank runs the same buckets whatever it holds.
        """
        target = out_dtype or self.dtype
        if self._split is not None and target.itemsize <= 4:
            out, read = self._take_split(target)
        else:
            out, read = _in_place(self._own_vector(target), target)
        return out, _narrow_into(out, read, normaliser, reduce, bucket)

    def _take_split(self, target: torch.dtype) -> tuple[torch.Tensor, _Read]:
        """The split sum's first buffer as the result (chunk c's values are read before results
        land on its slots) and its reader; the second buffer stays resident as the spare the
        clipped gradient can go into."""
        split, self._split = self._split, None
        assert split is not None
        self._spare = split.parts[1]
        return split.lo.view(target)[: split.n], split.read

    def _own_vector(self, target: torch.dtype) -> torch.Tensor:
        """One plain vector holding this rank's sum, wide enough to take `target` in place."""
        first = self._first
        if first is None and self._sum is None and self._split is None:
            self._sum = ParamSum(self.spec, self.pool, target)  # this rank closed nothing
        elif self._split is not None or (
            first is not None and first.flat.dtype.itemsize < target.itemsize
        ):
            self.widen()  # a result wider than the parts: there is no room in their own bytes
        own = self._sum if self._sum is not None else self._first
        assert own is not None
        if not own.flat.is_contiguous() or target.itemsize > own.flat.itemsize:
            raise ValueError(f"cannot narrow a {own.flat.dtype} update sum into {target}")
        return own.flat

    def clipped(self, grad: torch.Tensor, clip: float) -> torch.Tensor:
        """grad * clip (what the optimizer steps on; `grad` stays the pre-clip gradient): into the
        split sum's spent second buffer when there is one (resident pages, no new full-size
        vector), else a new vector. The same multiply either way."""
        spare = self._spare
        if clip != 1.0 and spare is not None and spare.flat.dtype == grad.dtype:
            return torch.mul(grad, clip, out=spare.flat)
        self.release_spare()  # not needed: give it back before the step allocates its state
        return grad if clip == 1.0 else grad * clip

    def release_spare(self) -> None:
        if self._spare is not None:
            self._spare.free()
            self._spare = None
