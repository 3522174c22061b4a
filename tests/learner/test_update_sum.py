"""The update's float64 sum kept in the parts' own fp32 buffers equals plain float64 arithmetic.

The reference is plain torch on separate float64 copies (no learner code): the sum of the parts in
float64, divided by -normaliser, narrowed to fp32 bit for bit, and its float64 norm.
"""

from __future__ import annotations

import pytest
import torch

from thundersync.learner.accumulators import BufferPool, FlatSpec, ParamSum
from thundersync.learner.update_sum import _BLOCK, _CHUNK, UpdateAccumulator
from thundersync.plan.live import LiveBytes


def _parts(n: int, k: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # magnitudes over many binades, so fp32 sums would round where float64 does not
    return [
        torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g))
        for _ in range(k)
    ]


def _accumulate(parts: list[torch.Tensor], pool: BufferPool) -> UpdateAccumulator:
    spec = FlatSpec([parts[0]])
    acc = UpdateAccumulator(spec, pool, torch.float64)
    for p in parts:
        s = ParamSum(spec, pool, torch.float32)
        s.add_vector(p)
        acc.take(s)
    return acc


@pytest.mark.parametrize(
    ("n", "k"),
    [(2 * _CHUNK + 12345, 2), (_BLOCK + 3, 3), (7, 4), (_CHUNK, 5)],
    ids=["odd-several-chunks", "past-one-block", "tiny", "one-chunk"],
)
def test_split_float64_sum_narrows_to_the_plain_float64_result_bit_for_bit(n: int, k: int) -> None:
    parts = _parts(n, k, seed=n + k)
    ref = torch.zeros(n, dtype=torch.float64)
    for p in parts:
        ref += p.double()
    ref_grad = (ref / -3.0).float()
    ref_norm = float(torch.linalg.vector_norm(ref / -3.0))

    pool = BufferPool("cpu")
    acc = _accumulate(parts, pool)
    assert acc._split is not None, "two fp32 parts on CPU should be summed in their own buffers"
    before = pool.allocations
    grad, norm = acc.finish(3.0, torch.float32)
    assert pool.allocations == before, "finishing allocated a full-size buffer"
    assert grad.dtype == torch.float32
    assert torch.equal(grad, ref_grad)
    assert norm == pytest.approx(ref_norm, rel=1e-12)


def test_split_and_plain_float64_sums_give_the_same_bits_and_norm() -> None:
    """A reducing rank widens to a plain vector; a single one finishes the split sum: same step."""
    n = _BLOCK + _CHUNK + 1
    parts = _parts(n, 3, seed=1)
    split = _accumulate(parts, BufferPool("cpu"))
    plain = _accumulate(parts, BufferPool("cpu"))
    plain.widen()
    assert torch.equal(plain.grad, sum((p.double() for p in parts), torch.zeros(n).double()))
    g1, n1 = split.finish(5.0, torch.float32)
    g2, n2 = plain.finish(5.0, torch.float32)
    assert torch.equal(g1, g2)
    assert n1 == n2


def test_one_part_stays_in_its_own_dtype_and_is_normalised() -> None:
    (p,) = _parts(1000, 1, seed=2)
    acc = _accumulate([p], BufferPool("cpu"))
    grad, norm = acc.finish(2.0, torch.float32)
    assert torch.equal(grad, p / -2.0)
    assert norm == pytest.approx(float(torch.linalg.vector_norm((p / -2.0).double())), rel=1e-12)


class _OtherRank:
    """A second rank's float64 sum, added bucket by bucket as `all_reduce(SUM)` would for 2 ranks
    (a + b is commutative: the same bits on both ranks)."""

    def __init__(self, other: torch.Tensor) -> None:
        self.other, self.at, self.buckets = other, 0, 0

    def __call__(self, vals: torch.Tensor) -> None:
        vals.add_(self.other[self.at : self.at + vals.numel()])
        self.at += vals.numel()
        self.buckets += 1


@pytest.mark.parametrize(
    ("k", "part_dtype"),
    [(3, torch.float32), (2, torch.float32), (1, torch.float32), (1, torch.float64), (0, None)],
    ids=["split-packed", "split-pair", "one-fp32-part", "one-fp64-part", "rank-closed-nothing"],
)
def test_reduced_finish_is_the_plain_float64_sum_over_ranks_without_a_widened_vector(
    k: int, part_dtype: torch.dtype | None
) -> None:
    """Ranks > 1 reduce each float64 bucket as it is read and narrow into their own buffers: the
    same bits as summing everything in float64 first, and no new 8N-byte vector on the rank."""
    n = 3 * _CHUNK + 777
    parts = _parts(n, k + 1, seed=10 + k)
    other = parts.pop().double() * 3.0  # the other rank's whole float64 sum
    ref = other.clone()
    for p in parts:
        ref += p.double().to(part_dtype or torch.float64).double()
    ref_grad = (ref / -4.0).float()
    ref_norm = float(torch.linalg.vector_norm(ref / -4.0))

    pool = BufferPool("cpu")
    spec = FlatSpec([torch.zeros(n)])
    acc = UpdateAccumulator(spec, pool, torch.float64)
    for p in parts:
        s = ParamSum(spec, pool, part_dtype or torch.float32)
        s.add_vector(p)
        acc.take(s)
    before = pool.allocations
    reduce = _OtherRank(other)
    with LiveBytes() as meter:
        grad, norm = acc.finish(4.0, torch.float32, reduce, bucket=_CHUNK)
    assert reduce.at == n and reduce.buckets == 4, "every element is reduced once, per bucket"
    assert torch.equal(grad, ref_grad)
    assert norm == pytest.approx(ref_norm, rel=1e-12)
    # one float64 bucket of scratch; a rank that closed nothing also needs its fp32 result vector
    allowed = 8 * _CHUNK + 4 * n * (k == 0) + 2**16
    assert meter.peak <= allowed, f"finishing held {meter.peak} bytes: a widened float64 copy?"
    if k:
        assert pool.allocations == before, "a rank with parts allocated a full-size buffer"


def test_reduced_finish_gives_the_bits_of_reducing_the_widened_sum_first() -> None:
    """The old path (widen, all-reduce the whole vector, finish) and the bucketed one agree bit for
    bit, for a bucket that is not a multiple of the norm's block."""
    n = 2 * _BLOCK + 5
    parts = _parts(n, 4, seed=7)
    other = parts.pop().double()
    old = _accumulate(parts, BufferPool("cpu"))
    old.widen()
    old.grad.add_(other)
    g_old, n_old = old.finish(3.0, torch.float32)
    new = _accumulate(parts, BufferPool("cpu"))
    g_new, n_new = new.finish(3.0, torch.float32, _OtherRank(other), bucket=_BLOCK + 17)
    assert torch.equal(g_old, g_new)
    assert n_old == n_new
