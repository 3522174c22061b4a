"""Where the learner computes and in which precision: device choice, dtypes, determinism.

Device-generic by construction: every tensor the learner creates takes its device from the model's
parameters (compute) or from the accumulator device (host or the same device), so the same code
runs on CPU here and on CUDA on a GPU node.
"""

from __future__ import annotations

import os

import torch

from thundersync.config import AccumDevice, Device

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def canonical_device(d: torch.device) -> torch.device:
    """`cuda` as a tensor on it reports its device (`cuda:0`), so `t.device == d` holds: a bare
    `cuda` compares unequal to `cuda:0`, which sent device-accumulator gradients through the
    host staging path (and a CUDA sum then met a host gradient)."""
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def resolve_device(device: Device | str) -> torch.device:
    """`auto` is cuda when torch sees a GPU, else cpu; `cuda` without one is refused."""
    d = Device(device)
    if d is Device.AUTO:
        return canonical_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if d is Device.CUDA and not torch.cuda.is_available():
        raise RuntimeError(
            "learner.device is cuda but torch sees no GPU (CPU build or no driver): "
            "set learner.device: auto or cpu"
        )
    return canonical_device(torch.device(d.value))


def accumulator_device(accum: AccumDevice | str, compute: torch.device) -> torch.device:
    if AccumDevice(accum) is AccumDevice.HOST:
        return torch.device("cpu")
    return canonical_device(compute)


def set_determinism(enabled: bool, device: torch.device) -> None:
    """Deterministic kernels (same bits run after run on one GPU type); costs some speed.

    cuBLAS needs a fixed workspace for deterministic matmuls: set before the first CUDA call.
    """
    if not enabled:
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
