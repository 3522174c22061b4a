"""Host accumulation adds split over threads, bit for bit the single-thread add.

The learner runs one torch thread (a matmul's result depends on the thread count), so every
trajectory's `G += w H` over all parameters is one core's memory bandwidth (issue 33: ~14 s per
trajectory at 8B). An elementwise add does not depend on how its range is split as long as every
piece starts on the same vector lane as in the whole-range loop, so the range is cut at multiples
of `ALIGN` elements and each piece runs as its own one-thread torch add in a worker thread (torch
releases the GIL inside the op). `tsrl bench host-adds` measures the throughput per thread count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

ALIGN = 1024  # elements: a multiple of every CPU vector width, and of a cache line


def pieces(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering n elements, every start a multiple of ALIGN."""
    step = -(-n // max(1, parts))
    step = -(-step // ALIGN) * ALIGN
    return [(i, min(n, i + step)) for i in range(0, n, step)] if n else []


def parallel_add_(
    dst: torch.Tensor, src: torch.Tensor, alpha: float, pool: ThreadPoolExecutor | None
) -> torch.Tensor:
    """dst += alpha * src over flat contiguous vectors, split across `pool`'s threads (None: in
    this thread)."""
    if pool is None or dst.numel() < 2 * ALIGN:
        return dst.add_(src, alpha=alpha)
    d, s = dst.view(-1), src.view(-1)
    workers = pool._max_workers  # noqa: SLF001 - the executor's own size
    futs = [
        pool.submit(lambda a, b: d[a:b].add_(s[a:b], alpha=alpha), a, b)
        for a, b in pieces(d.numel(), workers)
    ]
    for f in futs:
        f.result()
    return dst
