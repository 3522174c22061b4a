"""The peak FLOP/s that MFU divides by: `mfu_peak_flops` when set; on a GPU the device's dense bf16
peak from its datasheet (`GPU_BF16_DENSE`, as the paper's MFU); on CPU (or a GPU not in the table)
measured on this machine and labelled so (`mfu_peak`).

A fixed guess (it was 1e11) makes MFU meaningless across machines. Here: the best of a few rounds
of square matmuls (the learner's dominant op) in the learner's compute dtype, on the thread count
the learner uses, on the CPU (or on the GPU when the learner runs on CUDA), cached per machine,
device, dtype, size, torch version and threads under the ThunderSync cache, so a run measures it
once. On a GPU the matrices are 8192 wide and the dtype is the model's (bf16 for a bf16 model):
a 1024-wide fp32 product reaches a few percent of an H200's dense bf16 peak, which overstated
MFU about 20x there.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

from thundersync.cache import cache_root

_N = 1024  # CPU
_N_GPU = 8192


def _measure(
    device: torch.device, dtype: torch.dtype, n: int, rounds: int = 5, reps: int = 4
) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm up (kernel selection, caches)
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * n**3 / best


def measured_peak_flops(
    device: str | torch.device = "cpu",
    threads: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> float:
    dev = torch.device(device)
    threads = threads or torch.get_num_threads()
    n = _N_GPU if dev.type == "cuda" else _N
    name = dev.type if dev.type != "cuda" else torch.cuda.get_device_name(dev).replace(" ", "_")
    kind = str(dtype).removeprefix("torch.")
    key = (
        f"{platform.node()}-{platform.machine()}-{name}-{kind}-n{n}-t{threads}"
        f"-torch{torch.__version__}"
    )
    path = cache_root() / "peak-flops" / f"{key}.json"
    try:
        return float(json.loads(path.read_text())["flops"])
    except (OSError, ValueError, KeyError):
        pass
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = _measure(dev, dtype, n)
    finally:
        torch.set_num_threads(old)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"flops": flops, "n": n, "dtype": kind, "threads": threads}))
    tmp.replace(path)  # atomic: racing runs both write a valid file
    return flops


# NVIDIA datasheets: dense (no sparsity) bf16 tensor-core FLOP/s; the first name found in the
# device's name wins, so the PCIe / NVL variants come before their SXM parts
GPU_BF16_DENSE: tuple[tuple[str, float], ...] = (
    ("B200", 2.25e15),
    ("H200 NVL", 8.35e14),
    ("H200", 9.89e14),
    ("H100 PCIe", 7.56e14),
    ("H100 NVL", 8.35e14),
    ("H100", 9.89e14),
    ("A100", 3.12e14),
)


def table_peak(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU named `device_name`, or None if not listed."""
    return next((flops for key, flops in GPU_BF16_DENSE if key in device_name), None)


def mfu_peak(
    configured: float | None, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) for the learner on `device`."""
    if configured is not None:
        return configured, "mfu_peak_flops (config)"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        flops = table_peak(name)
        if flops is not None:
            return flops, f"{name}: datasheet dense bf16 peak"
        measured = measured_peak_flops(device, dtype=torch.bfloat16)
        return measured, f"{name}: measured bf16 matmul (not in the table: set mfu_peak_flops)"
    kind = str(dtype).removeprefix("torch.")
    return measured_peak_flops(device, threads=1, dtype=dtype), f"cpu: measured {kind} matmul"
