"""`tsrl bench host-adds`: host accumulation throughput against the number of threads.

Every trajectory adds its fp32 gradient into the group's G1 and G2 on the host (issue 33). This
measures `dst += w * src` on `elements` fp32 values, median of `rounds`, for each thread count:
split by `learner.host_adds.parallel_add_` (aligned pieces, one torch thread each) and, for
comparison, torch's own intra-op threads; it checks the split result bit for bit against one
thread, and turns the throughput into host seconds per trajectory at 8B and 27B parameters.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from thundersync.learner.host_adds import parallel_add_

SIZES = {"8b": 8.0e9, "27b": 2.7e10}


def _time(fn: Any, rounds: int) -> float:
    fn()  # warm: pages faulted in, threads started
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_host_adds(elements: int, threads: list[int], rounds: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    src = torch.randn(elements, generator=g)
    base = torch.randn(elements, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = base.clone().add_(src, alpha=0.37)
        rows = []
        for t in threads:
            dst = base.clone()
            with ThreadPoolExecutor(t) as pool:
                split_s = _time(lambda d=dst, p=pool: parallel_add_(d, src, 0.37, p), rounds)
                check = base.clone()
                parallel_add_(check, src, 0.37, pool)
            torch.set_num_threads(t)
            intra_s = _time(lambda d=dst: d.add_(src, alpha=0.37), rounds)
            torch.set_num_threads(1)
            per_s = elements / split_s
            rows.append(
                {
                    "threads": t,
                    "split_s": round(split_s, 5),
                    "split_gb_s": round(12 * elements / split_s / 1e9, 2),  # 2 reads + 1 write
                    "intra_op_s": round(intra_s, 5),
                    "bitwise_equal": bool(torch.equal(check, want)),
                    **{f"s_per_trajectory_{k}": round(2 * n / per_s, 2) for k, n in SIZES.items()},
                }
            )
    finally:
        torch.set_num_threads(old)
    one = rows[0]["split_s"]
    return {
        "elements": elements,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
        "best_speedup": round(max(one / r["split_s"] for r in rows), 2),
        "bitwise_equal": all(r["bitwise_equal"] for r in rows),
    }
