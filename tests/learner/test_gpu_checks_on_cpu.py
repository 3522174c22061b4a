"""`tsrl bench gpu`'s code path on the CPU (a GPU session must not be the first to run it)."""

from __future__ import annotations

import torch


def test_determinism_check_runs_and_is_bitwise_on_cpu() -> None:
    from thundersync.bench.gpu_checks import determinism_check

    res = determinism_check("cpu", deterministic=True)
    assert res["bitwise_equal"] and res["max_abs_diff"] == 0.0
    assert not torch.are_deterministic_algorithms_enabled()  # restored for the rest of the suite


def test_memory_check_runs_bf16_with_fp32_master_on_cpu() -> None:
    from thundersync.bench.gpu_checks import memory_check

    res = memory_check("cpu", small=True)
    assert res["master_dtype"] == "float32"
    assert res["peak_gb_sync"] > 0 and res["peak_gb_stream"] > 0
